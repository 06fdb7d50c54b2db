"""A serialized tf.train.Example's text or token ids (`example_text`, `example_ids`), read
without TensorFlow through the project's own copy of the protos; `make_example` writes one."""

from __future__ import annotations

import functools
import numbers
from collections.abc import Sequence

import numpy as np

from input_server.errors import RecordError, shorten

# Below this many ids `np.fromiter` beats `np.array`'s fixed cost (measured with upb 7.36).
_FEW_IDS = 48
# Each kind of `Feature` in words, for messages.
_KINDS = {
    "bytes_list": "a bytes_list (byte strings)",
    "float_list": "a float_list (floats)",
    "int64_list": "an int64_list (integers)",
}


@functools.cache
def _protos():
    """The Example class and protobuf's decode error, imported once (not a lookup a record)."""
    from google.protobuf.message import DecodeError

    from input_server import tf_example_pb2

    return tf_example_pb2.Example, DecodeError


def _parse(raw: bytes, where: str):
    example_class, decode_error = _protos()
    example = example_class()
    try:
        example.ParseFromString(raw)
    except decode_error as e:
        raise RecordError(f"{where}: not a serialized tf.train.Example ({e}).") from e
    return example.features.feature


def _feature(raw: bytes, field: str, where: str, kind: str):
    """The Example's list of `kind` named `field`; a missing one or one of another kind is
    refused, naming the features the Example has."""
    features = _parse(raw, where)
    if field not in features:
        raise RecordError(
            f"{where}: the Example has no feature {field!r} (it has: {_names(features)})."
        )
    feature = features[field]
    held = feature.WhichOneof("kind")
    if held != kind:
        what = _KINDS[held] if held else "no list at all (an empty Feature)"
        raise RecordError(
            f"{where}: feature {field!r} holds {what}, not {_KINDS[kind]}; "
            f"the Example has: {_names(features)}."
        )
    return getattr(feature, kind).value


def _names(features) -> str:
    """The first features by name and kind: `'ids' (int64_list), 'text' (bytes_list)`."""
    names = sorted(features)
    listed = [f"{n!r} ({features[n].WhichOneof('kind') or 'empty'})" for n in names[:10]]
    more = f", ... ({len(names)} in all)" if len(names) > 10 else ""
    return (", ".join(listed) or "no features") + more


def example_text(raw: bytes, field: str, where: str) -> str:
    """The text of an Example's feature `field`: a `bytes_list` of one UTF-8 string.

    Raises:
      RecordError: `raw` is not an Example, or the feature is missing, of another kind, holds
        other than one string, or is not UTF-8; the message names `where` and the feature.
    """
    values = _feature(raw, field, where, "bytes_list")
    if len(values) != 1:
        raise RecordError(f"{where}: feature {field!r} holds {len(values)} byte strings, not 1.")
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"{where}: feature {field!r} is not valid UTF-8 ({e}).") from e


def example_ids(raw: bytes, field: str, where: str) -> np.ndarray:
    """The token ids of an Example's feature `field`: its `int64_list`, as int64.

    The C protobuf (upb) hands its repeated field to numpy whole (`__array__`): under 1 ns an
    id after a fixed 5 us, where `np.array(list(values))` or `np.fromiter` make a Python int of
    each (about 60-100 ns); `np.fromiter` is faster only for the shortest lists.

    Raises:
      RecordError: `raw` is not an Example, or the feature is missing or not an `int64_list`;
        the message names `where`, the feature and the features the Example has.
    """
    values = _feature(raw, field, where, "int64_list")
    if len(values) < _FEW_IDS:
        return np.fromiter(values, np.int64, len(values))
    return np.array(values, dtype=np.int64)


def make_example(**features: str | bytes | Sequence[int] | Sequence[float]) -> bytes:
    """A serialized tf.train.Example of `features`: a string (or bytes) is a `bytes_list` of
    one value, a sequence of integers an `int64_list`, of floats a `float_list`.

    Raises:
      TypeError: a value of another type (a bool among integers, a mixed sequence).
    """
    from input_server import tf_example_pb2

    example = tf_example_pb2.Example()
    for name, value in features.items():
        feature = example.features.feature[name]
        kind = _kind_of(value)
        if kind is None:
            raise TypeError(
                f"feature {name!r}: expected a string, or a sequence of integers or of floats, "
                f"got {type(value).__name__} {shorten(repr(value), 80)}."
            )
        if kind == "bytes_list":
            feature.bytes_list.value.append(value.encode() if isinstance(value, str) else value)
        elif kind == "int64_list":
            feature.int64_list.SetInParent()  # present though empty: a document of 0 ids
            feature.int64_list.value.extend(list(map(int, value)))
        else:
            feature.float_list.value.extend(float(v) for v in value)
    return example.SerializeToString()


def _kind_of(value: object) -> str | None:
    if isinstance(value, str | bytes):
        return "bytes_list"
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, Sequence):
        return None
    if all(type(v) is int for v in value):  # the common case, without the ABCs' cost
        return "int64_list"
    # bool is an Integral to Python, but never a token id.
    if all(isinstance(v, numbers.Integral) and not isinstance(v, bool | np.bool_) for v in value):
        return "int64_list"
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool | np.bool_) for v in value):
        return "float_list"
    return None
