"""The page headers of a Parquet column chunk, read before any page is: the sizes the Parquet
reader allocates and decompresses each page to (it refuses a page that decompresses to another
size), which a file's footer may understate, and how many values each page holds.

A header is a Thrift compact-protocol struct (parquet.thrift's `PageHeader`): fields 1 type,
2 uncompressed_page_size, 3 compressed_page_size, then the page kind's own header (5 data, 7
dictionary, 8 data v2), whose field 1 is its number of values. The walk is bounded: headers of
at most MAX_HEADER_BYTES, nested at most MAX_DEPTH, and at most MAX_PAGES pages a chunk.
"""

from __future__ import annotations

import dataclasses

from input_server.errors import CorruptFileError

MAX_PAGES = 1 << 20  # a header is ~10 bytes or more: the walk is bounded by the file too
MAX_HEADER_BYTES = 1 << 20
MAX_DEPTH = 16
DICTIONARY_PAGE = 2
# Compact protocol field types whose value is a zigzag varint, or fixed bytes.
_VARINT, _FIXED = {4, 5, 6}, {3: 1, 7: 8}


@dataclasses.dataclass(frozen=True)
class Page:
    kind: int  # parquet.thrift's PageType: 0 data, 2 dictionary, 3 data v2
    uncompressed: int  # bytes, as the reader allocates it
    compressed: int
    values: int  # values (or dictionary entries) it holds, levels' nulls included


class _Reader:
    def __init__(self, raw: bytes):
        self.raw, self.at = raw, 0

    def byte(self) -> int:
        if self.at >= len(self.raw):
            raise ValueError("the header runs past what was read")
        self.at += 1
        return self.raw[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def skip(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.raw):
            raise ValueError("a value runs past what was read")
        self.at += n

    def value(self, kind: int, depth: int):
        """A value of compact type `kind`: an int, a struct's {field: value}, else None."""
        if kind in (1, 2):
            return kind == 1
        if kind in _VARINT:
            return self.zigzag()
        if kind in _FIXED:
            return self.skip(_FIXED[kind])
        if kind == 8:
            return self.skip(self.varint())
        if kind in (9, 10):
            head = self.byte()
            size, inner = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.byte() if inner in (1, 2) else self.value(inner, depth + 1)
            return None
        if kind == 11:
            size = self.varint()
            types = self.byte() if size else 0
            for _ in range(size):
                self.value(types >> 4, depth + 1)
                self.value(types & 0x0F, depth + 1)
            return None
        if kind == 12:
            return self.struct(depth + 1)
        raise ValueError(f"an unknown field type {kind}")

    def struct(self, depth: int = 0) -> dict:
        if depth > MAX_DEPTH:
            raise ValueError(f"structs nested past {MAX_DEPTH}")
        fields, last = {}, 0
        while (head := self.byte()) != 0:
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)
        return fields


def _header(f, at: int, end: int) -> tuple[_Reader, dict]:
    """The header at byte `at`: read in 4 KiB first (a header is tens of bytes, statistics
    aside), then in MAX_HEADER_BYTES if it runs past."""
    for size in (4096, MAX_HEADER_BYTES):
        f.seek(at)
        raw = f.read(min(size, end - at))
        reader = _Reader(raw)
        try:
            return reader, reader.struct()
        except ValueError:
            if len(raw) < size:  # all there was: it does not parse
                raise
    raise ValueError(f"a header longer than {MAX_HEADER_BYTES} bytes")


def chunk_pages(f, start: int, length: int, name: str) -> list[Page]:
    """The headers of the pages in bytes [start, start + length) of the open file `f` (a
    column chunk, as its footer places it: what the reader reads of it).

    Raises:
      CorruptFileError: a header that does not parse, or past the bounds above.
    """
    pages, at, end = [], start, start + length
    while at < end:
        if len(pages) >= MAX_PAGES:
            raise CorruptFileError(f"{name}: a column chunk of more than {MAX_PAGES} pages.")
        try:
            reader, h = _header(f, at, end)
            kind, uncompressed, compressed = h[1], h[2], h[3]
            own = h.get(7 if kind == DICTIONARY_PAGE else 8 if kind == 3 else 5) or {}
            values = own.get(1, 0) if isinstance(own, dict) else 0
        except (ValueError, KeyError) as e:
            raise CorruptFileError(f"{name}: a page header at byte {at} is unreadable ({e}).")
        if not all(isinstance(v, int) and v >= 0 for v in (uncompressed, compressed, values)):
            raise CorruptFileError(f"{name}: a page header at byte {at} gives a negative size.")
        pages.append(Page(kind, uncompressed, compressed, values))
        at += reader.at + compressed
    return pages
