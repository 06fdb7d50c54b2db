"""JSON-lines files (plain, .gz or .zst): random access to each line's text.

Plain files are memory-mapped and indexed by their newlines in chunks; compressed ones are
decompressed whole once per process. Picklable (Grain sends readers to worker processes); the
file opens lazily in the process that reads.
"""

from __future__ import annotations

import gzip
import mmap
from collections.abc import Sequence

import numpy as np
import orjson

from input_server import cancel
from input_server.data.records import check_size, loads_json, text_of
from input_server.errors import RecordError

_INDEX_CHUNK = 16 << 20


def _newlines(buf: np.ndarray, base: int) -> np.ndarray:
    return np.flatnonzero(buf == ord("\n")).astype(np.int64) + base


class JsonlReader:
    """JSON lines, plain or compressed (.gz, .zst). Blank lines are skipped.

    Plain files are indexed by line offsets and memory-mapped, so memory stays small (the page
    cache holds what was read); compressed files are decompressed into memory once per process
    (streams cannot seek).
    """

    max_bytes: int | None = None

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
                    cancel.check()  # a large file takes a while; the client may have left
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
        check_size(int(self._ends[index] - self._starts[index]), self.max_bytes, self.where(index))
        raw = self._raw(index)
        try:
            obj = loads_json(raw)
        except (ValueError, RecursionError) as e:
            raise RecordError(f"{self.where(index)}: not valid JSON ({e}).") from e
        return text_of(obj, self.text_field, self.where(index))

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The texts of many records; one pass with no per-record numpy or syscall."""
        buf, field = self._buffer(), self.text_field
        starts = self._starts[indices].tolist()
        ends = self._ends[indices].tolist()
        out = []
        limit = self.max_bytes
        for index, start, end in zip(indices, starts, ends, strict=True):
            if limit is not None and end - start > limit:
                out.append(self[index])  # raises, naming the line
                continue
            try:
                text = orjson.loads(buf[start:end])[field]
            except (ValueError, KeyError, TypeError):
                text = self[index]  # the slow path names the exact problem
            if type(text) is not str:
                text = self[index]
            out.append(text)
        return out
