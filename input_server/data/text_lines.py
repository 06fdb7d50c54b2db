"""Plain-text files (plain, .gz or .zst), a document a line: `format = "text"`.

The line index, the memory map, the decompression and its budget are `jsonl.JsonlReader`'s;
only what a line is differs. A line ends at "\\n", and a "\\r" before it goes with the ending
(a CRLF file gives the documents of its LF copy). A line of only ASCII whitespace (or empty)
is no document, as `input-server tokenizer train` skips it: both read the same documents, and
a blank separator line is not padded into a batch as a lone BOS/EOS. Every other line is a
document exactly as written, its leading and trailing spaces included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from input_server import cancel
from input_server.data.jsonl import JsonlReader
from input_server.data.records import check_size
from input_server.errors import RecordError

# The bytes Python's `bytes.strip()` removes, which `tokenizer train` tests lines with.
_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True
# Bytes looked at per step while finding blank lines: two bool arrays this size at a time.
_CHUNK = 4 << 20


class TextReader(JsonlReader):
    """A document a line of UTF-8 text. No fields: the line is the document."""

    plain = ".txt"

    def __init__(self, path: str, *, max_decompressed: int | None = None, name: str | None = None):
        super().__init__(path, "", max_decompressed=max_decompressed, name=name)

    def records(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The lines holding a byte other than ASCII whitespace, found a chunk at a time
        (a bool per byte of a chunk, an OR per line: no Python work per line)."""
        keep = np.zeros(len(starts), bool)
        size = int(ends[-1]) if len(ends) else 0
        if size == 0:  # an empty file (which cannot be mapped) has no document
            return keep
        with self.buffer() as buf:
            for a in range(0, size, _CHUNK):
                cancel.check()  # a large file takes a while; the client may have left
                b = min(a + _CHUNK, size)
                # Lines tile the file (each with its newline): those that reach into [a, b).
                first = int(np.searchsorted(ends, a, "left"))
                last = int(np.searchsorted(starts, b, "left"))
                cuts = np.maximum(starts[first:last], a) - a
                solid = ~_WHITESPACE[np.frombuffer(buf, np.uint8, b - a, a)]
                keep[first:last] |= np.logical_or.reduceat(solid, cuts)
        return keep

    def __getitem__(self, index: int) -> str:
        return self.read_many([index])[0]

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The documents of lines `indices` (records, blank lines not counted)."""
        starts, ends = self.spans(indices)
        out = []
        limit = self.max_bytes
        with self.buffer() as buf:
            for index, start, end in zip(indices, starts, ends, strict=True):
                if limit is not None and end - start > limit:  # named only when refused
                    check_size(end - start, limit, self.where(index))
                raw = buf[start:end]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
                try:
                    out.append(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise RecordError(
                        f"{self.where(index)}: not UTF-8 text ({e.reason} at byte {e.start} of "
                        f"the line); write the file as UTF-8."
                    ) from None
        return out
