"""Everything about the bytes on the wire, both directions.

A batch travels as `Tensor` messages of raw little-endian bytes, in compact form: `inputs` plus
each row's segment lengths (`PACKED_KEYS`). Segment ids, positions and the three shifted
`targets*` arrays follow from those, so the client derives them (`expand_packed`, MaxText's six
`FIELDS`) instead of the server computing and sending five more arrays per batch. Token ids of
a small vocabulary travel as uint16 (`narrow_ids`). Small batches share a message: the first,
then `Batch.following` (`batches_of`). The resume state travels as canonical JSON
(`encode_state`). Client and server both use this module; neither writes these names elsewhere.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from input_client.proto import pb

# The wire protocol: what a client must understand to read a server's batches. Client and
# server both say theirs (the stream request, the info reply), and refuse another.
#   1: compact packed batches (`inputs` + segment lengths), one batch a message.
#   2: token ids as uint16 when the vocabulary fits; small batches share a message
#      (`Batch.following`).
#   3: the stream is bidirectional: the client's later requests report the batches its loop
#      has taken (`batches_taken`), within its `window` (flow control).
PROTOCOL_VERSION = 3


def protocol_mismatch(server: str, server_version: int, client_version: int) -> str | None:
    """The refusal both sides give when their wire protocols differ (None when they agree);
    `server` names the server (its address and release, or "this server (...)")."""
    if server_version == client_version:
        return None

    def words(v: int) -> str:
        return str(v) if v else "one from before versions were sent"

    return (
        f"{server} speaks wire protocol {words(server_version)}; the client speaks "
        f"{words(client_version)}. Use the client of the same input-server release as the "
        f"server."
    )


# The compact form's tensors: every row is its segments end to end, then padding.
PACKED_KEYS = ("inputs", "segment_lengths", "segments_per_row")
# MaxText's six arrays, which the client derives from the compact form.
FIELDS = (
    "inputs",
    "inputs_segmentation",
    "inputs_position",
    "targets",
    "targets_segmentation",
    "targets_position",
)
# Vocabularies up to this size send their ids as uint16.
UINT16_VOCAB = 1 << 16
# Batches can be tens of MB (256 x 8192 x six int32 arrays is ~50 MB); gRPC's 4 MiB default
# receive limit would refuse them. Both sides' channels and servers use these options.
MESSAGE_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
# The most batches one message carries (`Batch.following`; the server's `serving/coalesce.py`):
# a client sizes its receive limit by it.
MAX_BATCHES_PER_MESSAGE = 16
# A client's unary calls (GetInfo, DescribeTokenizer) answer in a few KB; a server's info with
# many named pipelines of large mixtures stays far below this. Streams get their own channel,
# whose limit is sized from the spec (`_server_checks.Expected.receive_limit`).
CLIENT_RECEIVE_LIMIT = 64 << 20


def client_message_options(receive_limit: int = CLIENT_RECEIVE_LIMIT) -> list[tuple[str, int]]:
    """A client channel's message options: it sends what it must, and receives no more than
    `receive_limit` bytes a message (a server is not trusted with the client's memory)."""
    return [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", receive_limit),
    ]


def narrow_ids(inputs: np.ndarray, vocab_size: int | None) -> np.ndarray:
    """Token ids as they travel: uint16 when the vocabulary fits (half the bytes of int32;
    gRPC's cost per batch grows with its bytes), else as they are. `expand_packed` widens."""
    if vocab_size is not None and vocab_size <= UINT16_VOCAB:
        return inputs.astype(np.uint16)
    return inputs


def compact_arrays(
    inputs: np.ndarray,
    segment_lengths: np.ndarray,
    segments_per_row: np.ndarray,
    vocab_size: int | None,
) -> dict[str, np.ndarray]:
    """The tensors a packed batch travels as, by their `PACKED_KEYS` names."""
    return dict(
        zip(
            PACKED_KEYS,
            (narrow_ids(inputs, vocab_size), segment_lengths, segments_per_row),
            strict=True,
        )
    )


def batches_of(message: Any) -> tuple[Any, ...]:
    """The batches a `Batch` message carries, in order: itself, then its `following`."""
    return (message, *message.following)


def encode_tensors(arrays: Mapping[str, np.ndarray], into: Any = None) -> Any:
    """One `Tensor` per array, in little-endian byte order: a list, or added to `into` (a
    message's repeated `tensors` field), which saves copying the bytes into it later."""
    out = [] if into is None else into
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        fields = {"name": name, "dtype": a.dtype.name, "shape": a.shape, "data": a.tobytes()}
        if into is None:
            out.append(pb.Tensor(**fields))
        else:
            into.add(**fields)
    return out


def decode_tensors(tensors: Any) -> dict[str, np.ndarray]:
    """Arrays that view the message's bytes (`np.frombuffer`, no copy; read-only)."""
    out = {}
    for t in tensors:
        dtype = np.dtype(t.dtype).newbyteorder("<")
        out[t.name] = np.frombuffer(t.data, dtype=dtype).reshape(tuple(t.shape))
    return out


def shift_left(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """`a[:, t + 1]` at `t`, 0 at the last position: MaxText's targets from its inputs (as
    `dtype`, default `a`'s)."""
    out = np.empty(a.shape, dtype or a.dtype)
    out[:, :-1] = a[:, 1:]
    out[:, -1] = 0
    return out


@functools.lru_cache(maxsize=4)
def _indices(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 as int32, made once for a batch's size (read-only: shared)."""
    out = np.arange(n, dtype=np.int32)
    out.flags.writeable = False
    return out


def expand_packed(
    inputs: np.ndarray, segment_lengths: np.ndarray, segments_per_row: np.ndarray
) -> dict[str, np.ndarray]:
    """MaxText's six arrays from the compact form.

    `inputs` may hold uint16 ids (a small vocabulary's wire form); all six arrays are int32.
    `segment_lengths` lists every row's segment lengths, row after row; `segments_per_row`
    says how many belong to each row. Segment ids count 1, 2, ... within a row (0 = padding),
    positions 0, 1, ... within a segment; targets are the inputs shifted left by one, the last
    position 0, and so are targets_segmentation and targets_position.
    """
    rows, seq_len = inputs.shape
    wire_ids = inputs  # the targets are shifted from these: fewer bytes to read if uint16
    inputs = inputs.astype(np.int32, copy=False)  # ids may travel as uint16
    lengths = segment_lengths.astype(np.int64)
    per_row = segments_per_row.astype(np.int64)
    # Each row is its segments then one padding run; lay out all runs of the batch in order.
    row_ends = np.cumsum(per_row)
    cum = np.concatenate(([0], np.cumsum(lengths)))
    used = cum[row_ends] - cum[row_ends - per_row]  # real tokens per row
    slots = per_row + 1
    run_len = np.empty(int(slots.sum()), np.int64)
    pad_slot = np.cumsum(slots) - 1
    is_pad = np.zeros(len(run_len), bool)
    is_pad[pad_slot] = True
    run_len[~is_pad] = lengths
    run_len[pad_slot] = seq_len - used
    first_slot = pad_slot - per_row
    run_id = (np.arange(len(run_len)) - np.repeat(first_slot, slots) + 1).astype(np.int32)
    run_id[pad_slot] = 0
    seg = np.repeat(run_id, run_len).reshape(rows, seq_len)
    # A token's position: its index in the batch less its run's first token's (int32 from the
    # start: each pass over the batch's tokens is most of the client's time), then 0 in each
    # row's padding, its last `seq_len - used` tokens.
    run_start = (np.cumsum(run_len) - run_len).astype(np.int32)
    pos = np.repeat(run_start, run_len)
    np.subtract(_indices(rows * seq_len), pos, out=pos)
    pos = pos.reshape(rows, seq_len)
    if (used < seq_len).any():
        np.copyto(pos, 0, where=np.arange(seq_len) >= used[:, None])
    return dict(
        zip(
            FIELDS,
            (inputs, seg, pos, shift_left(wire_ids, np.int32), shift_left(seg), shift_left(pos)),
            strict=True,
        )
    )


def decode_batch(tensors: Any) -> dict[str, np.ndarray]:
    """A batch message's arrays, expanded to MaxText's six when it came in compact form."""
    arrays = decode_tensors(tensors)
    if set(arrays) == set(PACKED_KEYS):
        return expand_packed(**arrays)
    return arrays


def encode_state(state: Mapping[str, Any]) -> bytes:
    """A resume state as it travels: canonical JSON (sorted keys, no spaces, no NaN or
    Infinity, which JSON does not have)."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def is_resume_state(state: Any) -> bool:
    """Whether `state` can be a stream's resume state (the server checks the rest): a dict
    with a non-negative integer `seq`."""
    return isinstance(state, dict) and type(state.get("seq")) is int and state["seq"] >= 0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a state can hold")


def decode_state(blob: bytes) -> dict[str, Any]:
    """The state a batch carried; {} for none. Raises ValueError for anything but a JSON
    object of strict JSON (Python's reader would take NaN and Infinity)."""
    if not blob:
        return {}
    state = json.loads(blob.decode(), parse_constant=_no_constant)
    if not isinstance(state, dict):
        raise ValueError(f"a state is a JSON object, got {type(state).__name__}")
    return state
