"""Strict JSON of the figures `stats --json` prints: a figure that is not a finite number is
null. json.dumps writes bare NaN and Infinity, which strict parsers refuse (the whole reading
with them); protobuf's JSON mapping writes them as the strings "NaN" and "Infinity", which a
reader expecting a number takes for text."""

from __future__ import annotations

import json
import math
from typing import Any

from input_server.cli.info import repeated


def finite(value: Any) -> Any:
    """`value` with every float that is not a finite number made None, through dicts, lists and
    tuples: strict JSON has no NaN or Infinity, and strict parsers refuse the whole reading for
    one of them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """`value` as one line of strict JSON: a figure that is not a finite number is null (which
    `--json` documents as such a figure)."""
    return json.dumps(finite(value), allow_nan=False)


def message_dict(message) -> dict:
    """`message` as protobuf's JSON mapping gives it, but a float field that is not a finite
    number null: the mapping writes it as the string "NaN" or "Infinity", which a reader
    expecting a number takes for text (`_null_non_finite`)."""
    from google.protobuf import json_format

    out = json_format.MessageToDict(message, always_print_fields_with_no_presence=True)
    _null_non_finite(message, out)
    return out


def _null_non_finite(message, out: dict) -> None:
    """Sets to None each float of `out` (`message`'s JSON mapping) that is not a finite number,
    through nested, repeated and map fields; by the message's own fields, so a string field
    that reads "NaN" stays as it is."""
    from google.protobuf.descriptor import FieldDescriptor as F

    floats = (F.TYPE_DOUBLE, F.TYPE_FLOAT)
    for field, value in message.ListFields():
        key = field.json_name
        if field.type in floats:
            if repeated(field):
                out[key] = [v if math.isfinite(v) else None for v in value]
            elif not math.isfinite(value):
                out[key] = None
        elif field.type == F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            kind = field.message_type.fields_by_name["value"].type
            for k, v in value.items():
                name = str(k).lower() if isinstance(k, bool) else str(k)
                if kind == F.TYPE_MESSAGE:
                    _null_non_finite(v, out[key][name])
                elif kind in floats and not math.isfinite(v):
                    out[key][name] = None
        elif field.type == F.TYPE_MESSAGE and repeated(field):
            for v, o in zip(value, out[key], strict=True):
                _null_non_finite(v, o)
        elif field.type == F.TYPE_MESSAGE:
            _null_non_finite(value, out[key])
