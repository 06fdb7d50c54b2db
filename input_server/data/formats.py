"""Each source format's reader, by its name in the client's table (`input_client.formats`).

The client's table says which formats a spec may name and which keys each reads; this one says
how the server opens a file of each. A test holds the two to the same names, so a format added
there without a reader here (or a reader left here without its row) fails before it ships.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from input_client.spec import SourceSpec
from input_server.data.array_record import ArrayRecordReader
from input_server.data.jsonl import JsonlReader
from input_server.data.parquet import ParquetReader
from input_server.data.records import Reader
from input_server.data.text_lines import TextReader

# A reader of one file: (path, the spec's source, the process's budget of decompressed bytes,
# the path as the client wrote it) -> the reader.
Opener = Callable[[str, SourceSpec, int | None, str | None], Reader]


def _jsonl(path: str, spec: SourceSpec, max_decompressed: int | None, name: str | None) -> Reader:
    return JsonlReader(
        path,
        spec.text_field,
        token_field=spec.token_field or None,
        max_decompressed=max_decompressed,
        name=name,
    )


def _text(path: str, spec: SourceSpec, max_decompressed: int | None, name: str | None) -> Reader:
    return TextReader(path, max_decompressed=max_decompressed, name=name)


def _arrayrecord(
    path: str, spec: SourceSpec, max_decompressed: int | None, name: str | None
) -> Reader:
    return ArrayRecordReader(
        path, spec.text_field, spec.record_format, token_field=spec.token_field or None, name=name
    )


def _parquet(path: str, spec: SourceSpec, max_decompressed: int | None, name: str | None) -> Reader:
    return ParquetReader(
        path,
        spec.text_field,
        token_field=spec.token_field or None,
        name=name,
        max_decompressed=max_decompressed,
    )


def _tfrecord(
    path: str, spec: SourceSpec, max_decompressed: int | None, name: str | None
) -> Reader:
    # Imported only when a spec names TFRecord, as before (google_crc32c loads with it).
    from input_server.data.tfrecord import TFRecordReader

    return TFRecordReader(path, spec.text_field, token_field=spec.token_field or None, name=name)


READERS: Mapping[str, Opener] = MappingProxyType(
    {
        "jsonl": _jsonl,
        "text": _text,
        "arrayrecord": _arrayrecord,
        "parquet": _parquet,
        "tfrecord": _tfrecord,
    }
)
