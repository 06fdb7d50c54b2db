"""JSON-lines files (plain, .gz or .zst): random access to each line's text, or to its token
ids (`token_field`, a list of integers: `ids_of`).

Plain files are memory-mapped (through `OPEN_FILES`, which bounds the descriptors a process
keeps) and indexed by their newlines in chunks; compressed ones are decompressed streaming,
within the server's --max-decompressed-mb (one budget per process, `records.DECOMPRESSED`),
and held once per process. Picklable (Grain sends
readers to worker processes); the file opens lazily in the process that reads.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import mmap
import operator
import threading
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import numpy as np
import orjson
import simdjson

from input_server import cancel, stages
from input_server.data.records import (
    DECOMPRESSED,
    OPEN_FILES,
    Reservation,
    check_size,
    loads_json,
    said,
    text_of,
)
from input_server.errors import InputServerError, OverBudgetError, RecordError, shorten

_INDEX_CHUNK = 16 << 20
# Compressed bytes read from the file at once, and decompressed output between two checks
# for a client that left.
_READ = 1 << 20
_CHECK_EVERY = 16 << 20
# Compressed bytes fed to zstd per call: zstd cannot cap one call's output, and a 4-byte RLE
# block expands to 128 KiB, so 1 KiB of a bomb is at most 32 MiB before the bound is checked
# (small feeds cost no speed: docs/architecture.md, "Compressed files").
_ZSTD_FEED = 1 << 10
_MIB = 1 << 20


def _newlines(buf: np.ndarray, base: int) -> np.ndarray:
    return np.flatnonzero(buf == ord("\n")).astype(np.int64) + base


def _gzip_chunks(f: BinaryIO) -> Iterator[bytes]:
    # GzipFile reads every member, checks each CRC, raises EOFError on a cut-off member, and
    # returns at most what is asked for per read, however well the data compresses.
    with gzip.GzipFile(fileobj=f, mode="rb") as z:
        while out := z.read(_READ):
            yield out


def _zstd_chunks(f: BinaryIO) -> Iterator[bytes]:
    import zstandard

    d = zstandard.ZstdDecompressor()
    obj, fed = d.decompressobj(), False  # fed: the current frame has begun
    while raw := f.read(_READ):
        view = memoryview(raw)
        for i in range(0, len(view), _ZSTD_FEED):
            piece = view[i : i + _ZSTD_FEED]
            while piece:  # every frame (concatenated files, pzstd)
                fed = True
                out = obj.decompress(piece)
                if out:
                    yield out
                piece = b""
                if obj.eof:
                    piece, obj, fed = obj.unused_data, d.decompressobj(), False
    if fed:
        raise EOFError("the file ends inside a zstd frame (truncated?)")


def ids_of(obj: object, field: str, where: str) -> np.ndarray:
    """The token ids in a JSON object's `field`: a list of integers within int64, as int64.

    Raises:
      RecordError: `obj` is not an object, has no `field`, or it holds other than a list of
        integers (a string, a bool, a float, a nested list, null) or an integer outside int64;
        the message names `where`, the field and what it holds.
    """
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(obj).__name__}.")
    if field not in obj:
        keys = ", ".join(sorted(obj)[:10])
        raise RecordError(f"{where}: no field {field!r} (the record has: {keys}).")
    ids = _ids(obj[field])
    if ids is None:
        raise RecordError(f"{where}: field {field!r} {_not_ids(obj[field])}")
    return ids


def _ids(value: object) -> np.ndarray | None:
    """`value` as int64 ids, None unless it is a list of integers within int64."""
    if type(value) is not list:
        return None
    if not value:
        return np.zeros(0, np.int64)
    try:
        # Inferred, not cast: a cast would take 1.5 and "7" silently, inference makes float or
        # str arrays of them (of 2**63 uint64, of larger ints or null object; of nested lists
        # 2-D or an error). Bools it takes as 0 and 1 among ints: checked below.
        ids = np.array(value)
    except (ValueError, OverflowError, TypeError):
        return None
    if ids.dtype != np.int64 or ids.ndim != 1:
        return None
    # Bools among integers become 0 and 1: only those ids need a look at the objects.
    maybe = np.flatnonzero(ids.view(np.uint64) <= 1)
    if maybe.size and any(type(value[i]) is bool for i in maybe.tolist()):
        return None
    return ids


def _not_ids(value: object) -> str:
    """What a field that is not a list of ids holds, in words, for a message."""
    if type(value) is not list:
        return f"holds {_described(value)}, not a list of token ids."
    for i, v in enumerate(value):
        if type(v) is int and not -(1 << 63) <= v < 1 << 63:
            return f"holds {v} at position {i}, outside int64: not a token id."
        if type(v) is not int:
            return f"holds {_described(v)} at position {i}, not an integer token id."
    return f"holds {_described(value)}, not a list of token ids."


_JSON_TYPES = {
    str: "a string",
    bool: "a boolean",
    dict: "an object",
    list: "a list",
    int: "an integer",
    # orjson reads an integer past 64 bits as a float.
    float: "a number with a fraction or exponent, or an integer past 64 bits",
}


def _described(value: object) -> str:
    """`value` as JSON (cut short), and its JSON type: `"7" (a string)`, `null`."""
    shown = shorten(json.dumps(value, ensure_ascii=False), 60)
    kind = _JSON_TYPES.get(type(value))
    return f"{shown} ({kind})" if kind else shown


class NotJsonError(RecordError):
    """A line of a jsonl file is not JSON: where it is the first, the file may be plain text."""


def json_ids(raw: bytes, field: str, where: str) -> np.ndarray:
    """The token ids in the JSON object `raw`'s `field`, by `ids_of`'s rules: read by simdjson
    where it reads them exactly (`_simd_ids`), else by orjson and `ids_of`, which name what is
    wrong (RecordError; ValueError: not JSON)."""
    ids = _simd_ids(_parser(), raw, field, b'"%s"' % field.encode())
    return ids if ids is not None else ids_of(loads_json(raw), field, where)


_PARSERS = threading.local()  # a simdjson parser is not to be shared between threads


# A parser keeps buffers of the largest document it has read for as long as it lives (~5 x
# its size); records past this go to orjson, so a thread's parser holds a few MiB at most.
PARSER_CAPACITY = 1 << 20


def _parser():
    parser = getattr(_PARSERS, "parser", None)
    if parser is None:
        parser = _PARSERS.parser = simdjson.Parser(max_capacity=PARSER_CAPACITY)
    return parser


def _simd_ids(parser, raw: bytes, field: str, key: bytes) -> np.ndarray | None:
    """A record's ids as simdjson reads them, straight into an int64 array: no Python int a
    token, which made orjson's parse ~70 % of reading ids (docs/benchmarks.md); `key` is the
    field's name in quotes, as bytes. None where it
    would not read them as `ids_of` does, for `ids_of` to read and name: any error (a float,
    a boolean, a string, null, out of int64, no such field, not an object, not JSON), and any
    record holding more than one list (simdjson flattens a nested list into its parent's
    numbers), a key that may repeat the field's (simdjson takes a repeated key's first value,
    orjson its last) or any escape (which may spell the field's name)."""
    if raw.count(b"[") != 1 or raw.count(key) != 1 or b"\\" in raw:
        return None
    doc = value = None
    try:
        doc = parser.parse(raw)
        value = doc[field]
        return np.frombuffer(value.as_buffer(of_type="i"), np.int64)
    except (ValueError, TypeError, KeyError, AttributeError):  # as it raises them
        return None
    except RuntimeError:  # a big integer; or the parser would not parse again: a new one
        _PARSERS.parser = None
        return None
    finally:
        # The parser refuses the next document while this one's objects live.
        doc = value = None  # noqa: F841


def _str(value: object) -> str | None:
    return value if type(value) is str else None


class JsonlReader:
    """JSON lines, plain or compressed (.gz, .zst). Blank lines are skipped. A reader with a
    `token_field` reads each line's token ids (int64 arrays; `text_field` unused), else its text.

    Plain files are indexed by line offsets and memory-mapped, so memory stays small (the page
    cache holds what was read); compressed files are decompressed into memory once per process
    (streams cannot seek) and kept until `close`, within `max_decompressed` bytes for all the
    process holds decompressed (`records.DECOMPRESSED`: every stream's and source's files),
    else OverBudgetError (RESOURCE_EXHAUSTED).
    """

    max_bytes: int | None = None
    plain = ".jsonl"  # what a compressed file over the budget is told to become

    def __init__(
        self,
        path: str,
        text_field: str,
        *,
        token_field: str | None = None,
        max_decompressed: int | None = None,
        name: str | None = None,
    ):
        self.path = path
        self.name = path if name is None else name  # in messages: the path as written
        self.text_field = text_field
        self.token_field = token_field
        self.max_decompressed = max_decompressed
        self._compressed = path.endswith((".gz", ".zst", ".zstd"))
        self._buf: bytearray | None = None
        self._held: Reservation | None = None  # the buffer's share of DECOMPRESSED
        self._lock = threading.Lock()
        self._starts, self._ends, self._lines, self._size = self._index()

    @property
    def decompressed_bytes(self) -> int:
        """What the file takes in memory once decompressed (0 for a plain, mapped file)."""
        return self._size if self._compressed else 0

    @stages.timed("decompress")
    def _decompress(self, expect: int | None = None) -> tuple[bytearray, Reservation]:
        """The file decompressed, each chunk reserved in the process's budget before it is
        kept; `expect`: its size when the stream opened it (any other size: it changed)."""
        held = Reservation()
        try:
            with open(self.path, "rb") as f:  # EMFILE here is the server's state, not the file's
                chunks = _gzip_chunks(f) if self.path.endswith(".gz") else _zstd_chunks(f)
                # `+=` grows the buffer by an eighth at a time (remapped in place, not copied:
                # glibc serves these sizes with mmap), so the peak is what is reserved plus
                # one chunk (gzip 1 MB, zstd at most 32 MiB), not twice the text.
                buf, checked = bytearray(), 0
                try:
                    for out in chunks:
                        if expect is not None and len(buf) + len(out) > expect:
                            raise self._changed()
                        if not held.grow(len(out), self.max_decompressed):
                            raise self._over_budget(len(buf) + len(out), held)
                        buf += out
                        if len(buf) - checked >= _CHECK_EVERY:
                            checked = len(buf)
                            cancel.check()  # a bomb takes seconds; the client may have left
                except InputServerError:
                    raise
                except Exception as e:  # corrupt archive: name the file, never a traceback
                    raise RecordError(
                        f"{self.name}: cannot decompress: {said(e, self.path, self.name)}"
                    ) from e
                finally:
                    chunks.close()
            if expect is not None and len(buf) != expect:
                raise self._changed()
        except BaseException:
            held.free()
            raise
        return buf, held

    def _changed(self) -> RecordError:
        return RecordError(f"{self.name}: changed since the stream opened it.")

    def _over_budget(self, size: int, held: Reservation) -> OverBudgetError:
        flag = (self.max_decompressed or 0) / _MIB
        others = DECOMPRESSED.held - held.bytes
        what = (
            f"would take the compressed files the server holds decompressed past {flag:g} MB "
            f"({others / _MIB:,.1f} MB held now, by this and other streams)"
            if others > 0 and size <= (self.max_decompressed or 0)
            else f"expands to more than {flag:g} MB when decompressed"
        )
        return OverBudgetError(
            f"{self.name} {what}, over the server's --max-decompressed-mb {flag:g} (compressed "
            f"files are held whole in memory); decompress it to plain {self.plain} (mapped from "
            f"disk, no limit), split it, or ask the operator for a larger limit."
        )

    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        if self._compressed:
            self._buf, self._held = self._decompress()
            size, parts = len(self._buf), []
            for at in range(0, size, _INDEX_CHUNK):
                n = min(_INDEX_CHUNK, size - at)
                parts.append(_newlines(np.frombuffer(self._buf, np.uint8, n, at), at))
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
        keep = self.records(starts, ends)
        return starts[keep], ends[keep], lines[keep], size

    def records(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Which lines (`starts[i]` to `ends[i]`, the newline left out) hold a record, as a
        mask: a reader of another kind of line (`text_lines.TextReader`) overrides it.

        Blank lines ("", "\r" or one space) are skipped; any longer line is a record, so a
        line of spaces is reported as invalid JSON rather than silently dropped."""
        keep = (ends - starts) > 1
        one = np.flatnonzero((ends - starts) == 1)
        for i in one:
            keep[i] = self._raw_span(int(starts[i]), int(ends[i])).strip() != b""
        return keep

    def __getstate__(self):
        # Workers reopen the file; never pickle a decompressed buffer, a map or a lock.
        state = self.__dict__.copy()
        state["_buf"] = state["_held"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._starts)

    def where(self, index: int) -> str:
        return f"{self.name} line {int(self._lines[index])}"

    def release(self) -> None:
        """Unmaps the file (its descriptor with it) now; a later read maps it again. The
        decompressed text of a compressed file stays."""
        OPEN_FILES.close(self)

    def close(self) -> None:
        """`release`, and drops the decompressed text, giving its bytes back to the process's
        budget (decompressed again if read)."""
        OPEN_FILES.close(self)
        held, self._held = self._held, None
        self._buf = None
        if held is not None:
            held.free()

    def _text(self) -> bytearray:
        """The decompressed file, once per process (threads wait for the first to finish)."""
        buf = self._buf
        if buf is None:
            with self._lock:
                buf = self._buf
                if buf is None:
                    # The size is known from the index: a file of another size changed.
                    buf, held = self._decompress(expect=self._size)
                    self._buf, self._held = buf, held
        return buf

    def _map(self) -> mmap.mmap:
        with open(self.path, "rb") as f:  # the map keeps a duplicate of the descriptor
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def buffer(self):
        """A context holding the file's bytes: mapped (and kept open) within it, or in memory.
        A view of them must not outlive the block (the map cannot close under one)."""
        if self._compressed:
            return contextlib.nullcontext(self._text())
        return OPEN_FILES.use(self, self._map, mmap.mmap.close)

    def spans(self, indices: Sequence[int]) -> tuple[list[int], list[int]]:
        """Where records `indices` start and end in the file (the newline left out)."""
        return self._starts[indices].tolist(), self._ends[indices].tolist()

    def _raw(self, index: int) -> bytes:
        return self._raw_span(int(self._starts[index]), int(self._ends[index]))

    def _raw_span(self, start: int, end: int) -> bytes:
        with self.buffer() as buf:
            return buf[start:end]

    def __getitem__(self, index: int) -> str | np.ndarray:
        check_size(int(self._ends[index] - self._starts[index]), self.max_bytes, self.where(index))
        raw = self._raw(index)
        try:
            obj = loads_json(raw)
        except (ValueError, RecursionError) as e:
            raise NotJsonError(f"{self.where(index)}: not valid JSON ({e}).") from e
        if self.token_field is not None:
            return ids_of(obj, self.token_field, self.where(index))
        return text_of(obj, self.text_field, self.where(index))

    def read_many(self, indices: Sequence[int]) -> list[str] | list[np.ndarray]:
        """The texts (or ids) of many records; one pass with no per-record syscall."""
        with self.buffer() as buf:
            if self.token_field is not None:
                return self._read_many_ids(buf, indices, self.token_field)
            return self._read_many(buf, indices, self.text_field)

    def _read_many_ids(self, buf, indices: Sequence[int], field: str) -> list[np.ndarray]:
        """Each record's ids, by simdjson where it reads them exactly (`_simd_ids`), else by
        `__getitem__`, which names what is wrong with the record."""
        starts, ends = self.spans(indices)
        limit, parser, key = self.max_bytes, _parser(), b'"%s"' % field.encode()
        out = []
        for index, start, end in zip(indices, starts, ends, strict=True):
            ids = None
            if limit is None or end - start <= limit:
                ids = _simd_ids(parser, buf[start:end], field, key)
            out.append(self[index] if ids is None else ids)
        return out

    def _read_many(self, buf, indices: Sequence[int], field: str) -> list[str]:
        """Each record's text `field`: in one pass where every record is within the size
        limit and has its text (the stream's many short documents: no Python per record
        beyond the parse), else record by record (`_read_each`)."""
        starts, ends = self.spans(indices)
        limit = self.max_bytes
        if limit is None or max(map(operator.sub, ends, starts), default=0) <= limit:
            try:
                loads = orjson.loads
                texts = [loads(buf[a:b])[field] for a, b in zip(starts, ends, strict=True)]
            except (ValueError, KeyError, TypeError):
                texts = None
            if texts is not None and all(type(t) is str for t in texts):
                return texts
        return self._read_each(buf, indices, starts, ends, field)

    def _read_each(
        self, buf, indices: Sequence[int], starts: list[int], ends: list[int], field: str
    ) -> list[str]:
        """Each record's text `field`, one at a time; a record that is not what it should be
        (or that orjson refuses) is read by `__getitem__`, which names what is wrong."""
        out = []
        limit = self.max_bytes
        for index, start, end in zip(indices, starts, ends, strict=True):
            if limit is not None and end - start > limit:
                out.append(self[index])  # raises, naming the line
                continue
            try:
                value = _str(orjson.loads(buf[start:end])[field])
            except (ValueError, KeyError, TypeError):
                value = None
            out.append(self[index] if value is None else value)
        return out
