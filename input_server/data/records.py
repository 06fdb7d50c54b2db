"""What every reader of one file provides, and the checks on a record's text they share."""

from __future__ import annotations

import json
from typing import Protocol

import orjson

from input_server.errors import InvalidSpecError, RecordError


class Reader(Protocol):
    """Random access to the documents of one file."""

    path: str
    max_bytes: int | None  # a longer record is refused (`check_size`)

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str: ...

    def where(self, index: int) -> str:
        """Names the record for error messages, e.g. `data.jsonl line 12`."""
        ...


def check_size(size: int, limit: int | None, where: str) -> None:
    """Refuses a record over the server's --max-document-mb before it is decoded: a 200 MB
    document would hold gigabytes while tokenized (INVALID_ARGUMENT, naming it and the limit)."""
    if limit is not None and size > limit:
        raise InvalidSpecError(
            f"{where}: the document is {size / (1 << 20):,.1f} MB, over the "
            f"server's --max-document-mb {limit / (1 << 20):g}; split it, or "
            f"ask the operator for a larger limit."
        )


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
