"""Document sources: random access to every record's text in jsonl, ArrayRecord or Parquet files.

Each reader is picklable (Grain sends it to worker processes) and opens its file lazily in the
process that reads. `DocumentSource` chains the readers of all files into one Grain
random-access source of strings.
"""

from __future__ import annotations

import bisect
import glob
import gzip
import json
import mmap
import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import orjson

from input_client.spec import SourceSpec
from input_server.errors import (
    CorruptFileError,
    DataNotFoundError,
    InvalidSpecError,
    RecordError,
    UnreadableError,
)

_GLOB_CHARS = frozenset("*?[")
_INDEX_CHUNK = 16 << 20


class Reader(Protocol):
    """Random access to the documents of one file."""

    path: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str: ...

    def where(self, index: int) -> str:
        """Names the record for error messages, e.g. `data.jsonl line 12`."""
        ...


def expand_paths(patterns: Sequence[str]) -> list[str]:
    """Expands globs (sorted, so the order is reproducible); every pattern must match a file."""
    files: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matched = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matched:
                raise DataNotFoundError(f"`source.paths`: the glob {pattern!r} matches no file.")
            files.extend(matched)
        elif os.path.isfile(pattern):
            files.append(pattern)
        else:
            raise DataNotFoundError(f"`source.paths`: no such file {pattern!r}.")
    return files


def _text_of(obj: object, field: str, where: str) -> str:
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


def _loads(raw: bytes) -> object:
    """orjson (several times faster) first; the standard parser for what orjson refuses."""
    try:
        return orjson.loads(raw)
    except ValueError:
        return json.loads(raw)


def _newlines(buf: np.ndarray, base: int) -> np.ndarray:
    return np.flatnonzero(buf == ord("\n")).astype(np.int64) + base


class JsonlReader:
    """JSON lines, plain or compressed (.gz, .zst). Blank lines are skipped.

    Plain files are indexed by line offsets and memory-mapped, so memory stays small (the page
    cache holds what was read); compressed files are decompressed into memory once per process
    (streams cannot seek).
    """

    def __init__(self, path: str, text_field: str):
        self.path = path
        self.text_field = text_field
        self._compressed = path.endswith((".gz", ".zst", ".zstd"))
        self._buf: bytes | mmap.mmap | None = None
        self._starts, self._ends, self._lines = self._index()

    def _data(self) -> bytes:
        with open(self.path, "rb") as f:
            raw = f.read()
        try:
            if self.path.endswith(".gz"):
                return gzip.decompress(raw)
            import zstandard

            # Every frame (concatenated files, pzstd), and a cut-off frame is an error.
            out, d = [], zstandard.ZstdDecompressor()
            while raw:
                obj = d.decompressobj()
                out.append(obj.decompress(raw))
                if not obj.eof:
                    raise EOFError("the file ends inside a zstd frame (truncated?)")
                raw = obj.unused_data
            return b"".join(out)
        except Exception as e:  # corrupt archive: name the file, never a traceback
            raise RecordError(f"{self.path}: cannot decompress: {e}") from e

    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._compressed:
            self._buf = self._data()
            size = len(self._buf)
            newlines = _newlines(np.frombuffer(self._buf, np.uint8), 0)
        else:
            parts, size = [], 0
            with open(self.path, "rb") as f:
                while chunk := f.read(_INDEX_CHUNK):
                    parts.append(_newlines(np.frombuffer(chunk, np.uint8), size))
                    size += len(chunk)
            newlines = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        starts = np.concatenate(([0], newlines + 1)).astype(np.int64)
        ends = np.concatenate((newlines, [size])).astype(np.int64)
        lines = np.arange(1, len(starts) + 1, dtype=np.int64)
        # Skip blank lines ("", "\r" or one space); any longer line is a record, so a line of
        # spaces is reported as invalid JSON rather than silently dropped.
        keep = (ends - starts) > 1
        one = np.flatnonzero((ends - starts) == 1)
        for i in one:
            keep[i] = self._raw_span(int(starts[i]), int(ends[i])).strip() != b""
        return starts[keep], ends[keep], lines[keep]

    def __getstate__(self):
        # Workers reopen the file; never pickle a decompressed buffer or a descriptor.
        state = self.__dict__.copy()
        state["_buf"] = None
        return state

    def __len__(self) -> int:
        return len(self._starts)

    def where(self, index: int) -> str:
        return f"{self.path} line {int(self._lines[index])}"

    def _raw(self, index: int) -> bytes:
        return self._raw_span(int(self._starts[index]), int(self._ends[index]))

    def _buffer(self) -> bytes | mmap.mmap:
        if self._buf is None:
            if self._compressed:
                self._buf = self._data()
            else:
                with open(self.path, "rb") as f:
                    self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._buf

    def _raw_span(self, start: int, end: int) -> bytes:
        return self._buffer()[start:end]

    def __getitem__(self, index: int) -> str:
        raw = self._raw(index)
        try:
            obj = _loads(raw)
        except (ValueError, RecursionError) as e:
            raise RecordError(f"{self.where(index)}: not valid JSON ({e}).") from e
        return _text_of(obj, self.text_field, self.where(index))

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The texts of many records; one pass with no per-record numpy or syscall."""
        buf, field = self._buffer(), self.text_field
        starts = self._starts[indices].tolist()
        ends = self._ends[indices].tolist()
        out = []
        for index, start, end in zip(indices, starts, ends, strict=True):
            try:
                text = orjson.loads(buf[start:end])[field]
            except (ValueError, KeyError, TypeError):
                text = self[index]  # the slow path names the exact problem
            if type(text) is not str:
                text = self[index]
            out.append(text)
        return out


class ArrayRecordReader:
    """ArrayRecord files; each record is a JSON object, UTF-8 text or a tf.train.Example."""

    def __init__(self, path: str, text_field: str, record_format: str):
        self.path = path
        self.text_field = text_field
        self.record_format = record_format
        self._reader = None
        try:
            reader = self._open()
            # A file that is not ArrayRecord opens with 0 records and `ok()` false.
            if not reader.ok():
                raise ValueError("the reader reports a corrupt file")
            self._len = reader.num_records()
        except Exception as e:
            raise RecordError(f"{path}: not a readable ArrayRecord file ({e}).") from e

    def _open(self):
        if self._reader is None:
            from array_record.python import array_record_module

            # No readahead: the pipeline reads in shuffled order.
            self._reader = array_record_module.ArrayRecordReader(
                self.path, "readahead_buffer_size:0")
        return self._reader

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

    def __len__(self) -> int:
        return self._len

    def where(self, index: int) -> str:
        return f"{self.path} record {index}"

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The texts of many records, read in one call."""
        try:
            raws = self._open().read(list(indices))
        except RuntimeError:  # a corrupt chunk: find and name the record
            return [self[i] for i in indices]
        return [self._decode(raw, i) for raw, i in zip(raws, indices, strict=True)]

    def __getitem__(self, index: int) -> str:
        try:
            raw = self._open().read([index])[0]
        except RuntimeError as e:
            raise RecordError(f"{self.where(index)}: cannot read ({e}).") from e
        return self._decode(raw, index)

    def _decode(self, raw: bytes, index: int) -> str:
        where = self.where(index)
        try:
            if self.record_format == "text":
                return raw.decode("utf-8")
            if self.record_format == "json":
                return _text_of(_loads(raw), self.text_field, where)
            return _example_text(raw, self.text_field, where)
        except UnicodeDecodeError as e:
            raise RecordError(f"{where}: not valid UTF-8 ({e}).") from e
        except ValueError as e:
            raise RecordError(f"{where}: not valid JSON ({e}).") from e


def _example_text(raw: bytes, field: str, where: str) -> str:
    from google.protobuf.message import DecodeError

    from input_server import tf_example_pb2

    example = tf_example_pb2.Example()
    try:
        example.ParseFromString(raw)
    except DecodeError as e:
        raise RecordError(f"{where}: not a serialized tf.train.Example ({e}).") from e
    features = example.features.feature
    if field not in features:
        keys = ", ".join(sorted(features)[:10])
        raise RecordError(f"{where}: the Example has no feature {field!r} (it has: {keys}).")
    values = features[field].bytes_list.value
    if len(values) != 1:
        raise RecordError(f"{where}: feature {field!r} holds {len(values)} byte strings, not 1.")
    return values[0].decode("utf-8")


class ParquetReader:
    """Parquet files; the text column is loaded once per process for random access."""

    def __init__(self, path: str, text_field: str):
        import pyarrow.parquet as pq

        self.path = path
        self.text_field = text_field
        self._column = None
        try:
            meta = pq.ParquetFile(path)
        except Exception as e:
            raise RecordError(f"{path}: not a readable Parquet file ({e}).") from e
        names = meta.schema_arrow.names
        if text_field not in names:
            raise InvalidSpecError(
                f"`source.text_field` {text_field!r} is not a column of {path} "
                f"(columns: {', '.join(names)}).")
        self._len = meta.metadata.num_rows

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_column"] = None
        return state

    def __len__(self) -> int:
        return self._len

    def where(self, index: int) -> str:
        return f"{self.path} row {index}"

    def _texts(self):
        if self._column is None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            f, chunks, first = pq.ParquetFile(self.path), [], 0
            for g in range(f.num_row_groups):
                rows = f.metadata.row_group(g).num_rows
                try:
                    chunks.append(f.read_row_group(g, columns=[self.text_field])
                                  .column(self.text_field))
                except (OSError, pa.ArrowException) as e:
                    raise CorruptFileError(f"{self.path} row group {g} (rows {first}-"
                                           f"{first + rows - 1}): cannot read ({e}).") from e
                first += rows
            self._column = pa.chunked_array(
                [c for ch in chunks for c in ch.chunks]).combine_chunks()
        return self._column

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The texts of many rows, taken in one vectorized call."""
        try:
            texts = self._texts().take(indices).to_pylist()
        except UnicodeDecodeError:  # find and name the row
            return [self[i] for i in indices]
        return [t if type(t) is str else self[i] for t, i in zip(texts, indices, strict=True)]

    def __getitem__(self, index: int) -> str:
        try:
            text = self._texts()[index].as_py()
        except UnicodeDecodeError as e:
            raise RecordError(f"{self.where(index)}: not valid UTF-8 ({e}).") from e
        if not isinstance(text, str):
            raise RecordError(f"{self.where(index)}: column {self.text_field!r} holds "
                              f"{type(text).__name__}, not a string.")
        return text


def open_reader(path: str, spec: SourceSpec) -> Reader:
    if spec.format == "jsonl":
        return JsonlReader(path, spec.text_field)
    if spec.format == "arrayrecord":
        return ArrayRecordReader(path, spec.text_field, spec.record_format)
    return ParquetReader(path, spec.text_field)


class DocumentSource:
    """All documents of all files, in file order: a Grain random-access data source of strings."""

    def __init__(self, readers: Sequence[Reader]):
        self._readers = list(readers)
        self._ends = np.cumsum([len(r) for r in self._readers]).tolist()

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> DocumentSource:
        """Opens every file the spec names and checks the first record of each can be read.

        Raises:
          DataNotFoundError: a path or glob names no file.
          InvalidSpecError: the text field is missing from the first record, or nothing to read.
          RecordError: a file is not of the format the spec says.
        """
        try:
            return cls._open(spec)
        except PermissionError as e:
            raise UnreadableError(f"`source.paths`: the server may not read "
                                  f"{e.filename or e} (permission denied).") from e

    @classmethod
    def _open(cls, spec: SourceSpec) -> DocumentSource:
        readers = [open_reader(p, spec) for p in expand_paths(spec.paths)]
        for r in readers:
            if len(r):
                try:
                    r[0]
                except CorruptFileError:  # a damaged file is DATA_LOSS, not a spec mistake
                    raise
                except RecordError as e:  # the first record failing is a spec mistake
                    raise InvalidSpecError(
                        f"`source` does not fit {r.path} (format={spec.format!r}, "
                        f"text_field={spec.text_field!r}, record_format={spec.record_format!r}): "
                        f"{e}") from e
        source = cls(readers)
        if len(source) == 0:
            raise InvalidSpecError(f"`source.paths` {list(spec.paths)!r} hold no records.")
        return source

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _locate(self, index: int) -> tuple[Reader, int]:
        f = bisect.bisect_right(self._ends, index)
        start = self._ends[f - 1] if f else 0
        return self._readers[f], index - start

    def __getitem__(self, index: int) -> str:
        reader, local = self._locate(index)
        return reader[local]

    def where(self, index: int) -> str:
        reader, local = self._locate(index)
        return reader.where(local)

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The texts of many records, in the order given, read file by file in bulk."""
        indices = np.asarray(indices, np.int64)
        files = np.searchsorted(self._ends, indices, side="right")
        out: list[str | None] = [None] * len(indices)
        for f in np.unique(files).tolist():
            where = np.flatnonzero(files == f)
            first = self._ends[f - 1] if f else 0
            local = (indices[where] - first).tolist()
            reader = self._readers[f]
            texts = (reader.read_many(local) if hasattr(reader, "read_many")
                     else [reader[i] for i in local])
            for slot, text in zip(where.tolist(), texts, strict=True):
                out[slot] = text
        return out
