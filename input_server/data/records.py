"""What every reader of one file provides, and the checks on a record's text they share."""

from __future__ import annotations

import json
from typing import Protocol

import orjson

from input_server.errors import RecordError


class Reader(Protocol):
    """Random access to the documents of one file."""

    path: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str: ...

    def where(self, index: int) -> str:
        """Names the record for error messages, e.g. `data.jsonl line 12`."""
        ...


def text_of(obj: object, field: str, where: str) -> str:
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(obj).__name__}.")
    if field not in obj:
        keys = ", ".join(sorted(obj)[:10])
        raise RecordError(f"{where}: no field {field!r} (the record has: {keys}).")
    text = obj[field]
    if not isinstance(text, str):
        raise RecordError(f"{where}: field {field!r} holds {type(text).__name__}, not a string.")
    try:
        text.encode()
    except UnicodeEncodeError as e:  # a lone surrogate escape ("\ud800"), which orjson refuses
        raise RecordError(f"{where}: field {field!r} is not valid Unicode ({e}).") from e
    return text


def loads_json(raw: bytes) -> object:
    """orjson (several times faster) first; the standard parser for what orjson refuses."""
    try:
        return orjson.loads(raw)
    except ValueError:
        return json.loads(raw)
