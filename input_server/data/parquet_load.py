"""Loading one Parquet column into memory within --max-decompressed-mb, row group by row group.

A Parquet column's footer sizes are what its pages take encoded, not decoded: a dictionary page
holding one 1 MiB string with 3,456 indices decodes to 3.6 GB (a 299-byte file), and 800 M
repeated ids encode to kilobytes. So each row group is reserved in the process's budget
(`records.DECOMPRESSED`, shared with compressed JSON lines) before it is decoded: ids by the
footer's count of values (8 bytes each at most, plus an offset a row), text by reading the
row group as dictionary indices first (what the file holds, at most its encoded size) and
summing the lengths the indices would decode to. A row group past the budget is refused with
RESOURCE_EXHAUSTED naming the file, the row group and the flag; nothing of it is decoded.
Each row group's page headers are read first (`parquet_pages`): what the reader will allocate
is reserved even where the footer understates it, and a text row group with a page whose
values' mean is past --max-document-mb (so one of them is) is refused with INVALID_ARGUMENT
before a page is read: an 803-byte file of one 381 MB cell took a server from 404 MB to 2,152 MB
before its row was refused. A long value among shorter ones is decoded within the budget and
refused, by its row, before it becomes a Python string (`largest_text`), so the shorter rows
stay readable.
Reserving first gives back other files' columns not being read right now, least recently used
first (`records.DECODED`): the budget bounds what is held at once, not what was ever read.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import numpy as np

from input_server import cancel
from input_server.data.parquet_pages import chunk_pages
from input_server.data.records import DECOMPRESSED, Reservation, check_size, said
from input_server.errors import CorruptFileError, OverBudgetError

_MIB = 1 << 20
# What an id of a list column takes decoded, by its physical type (at most an int64's), and
# each row's offset.
_ID_BYTES = {"INT32": 4, "INT64": 8}
_ID_BYTES_MAX = 8
_OFFSET_BYTES = 8
# What a page holds besides its values' bytes, per value: a length prefix (4) and at most a
# 32-bit definition level.
_SLACK_PER_VALUE = 8


class Texts:
    """A text column held as one arrow array a row group (joining them would copy the whole
    column; arrow's `ChunkedArray.take` joins them on every call, 9x slower): rows by index."""

    def __init__(self, arrays: Sequence):
        self._arrays = list(arrays)
        self._ends = np.cumsum([len(a) for a in self._arrays]).tolist()

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _locate(self, index: int) -> tuple[int, int]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is out of range (0-{len(self) - 1}).")
        c = bisect.bisect_right(self._ends, index)
        return c, index - (self._ends[c - 1] if c else 0)

    def __getitem__(self, index: int):
        c, local = self._locate(index)
        return self._arrays[c][local]

    def size(self, index: int) -> int:
        """Row `index`'s bytes, known before its value is made a Python string."""
        c, local = self._locate(index)
        return largest_text(self._arrays[c].slice(local, 1))

    def take(self, indices: Sequence[int], limit: int | None = None) -> list:
        """The values of rows `indices` as Python objects, in the order given; a value of
        more than `limit` bytes is None (never made a Python string)."""
        if len(self._arrays) == 1:
            return _within(self._arrays[0].take(indices), limit).to_pylist()
        rows = np.asarray(indices, np.int64).reshape(-1)
        rows = np.where(rows < 0, rows + len(self), rows)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"a row index is out of range (0-{len(self) - 1}).")
        chunk = np.searchsorted(self._ends, rows, side="right")
        out: list = [None] * len(rows)
        for c in np.unique(chunk).tolist():
            at = np.flatnonzero(chunk == c)
            first = self._ends[c - 1] if c else 0
            values = _within(self._arrays[c].take(rows[at] - first), limit).to_pylist()
            for slot, value in zip(at.tolist(), values, strict=True):
                out[slot] = value
        return out


class ColumnLoad:
    """One column of one Parquet file being loaded, every row group reserved before it is
    decoded; `held` is what the loaded column keeps reserved (free it with the column).

    Args:
      path, name: the file to open and its name in messages (as the client wrote it).
      column: the column's name.
      ids: whether the column is lists of token ids (else text).
      limit: --max-decompressed-mb in bytes; None = not counted.
      max_document: --max-document-mb in bytes; a row group holding a longer value is
        refused before it is decoded (None = no cap).
    """

    def __init__(
        self,
        path: str,
        name: str,
        column: str,
        *,
        ids: bool,
        limit: int | None,
        max_document: int | None = None,
    ):
        self.path, self.name, self.column, self.ids, self.limit = path, name, column, ids, limit
        self.max_document = max_document
        self.held = Reservation()
        self._estimate = 0  # the row group being read: what its footer said it takes
        self._transient = Reservation()  # a text row group's dictionary indices, while read

    def load(self) -> list:
        """The column's arrow arrays, one or more a row group, each reserved before it is
        decoded (text: one decoded array a row group).

        Raises:
          OverBudgetError: a row group would take the process past `limit`.
          CorruptFileError: a row group cannot be read.
        """
        return [a for arrays in self.each() for a in arrays]

    def each(self) -> Iterator[list]:
        """`load`, a row group at a time: its arrays, reserved before it was decoded; a
        caller that copies each out keeps no more than one row group of arrow memory."""
        import pyarrow.parquet as pq

        try:
            # Text is read as dictionary indices first: what a row group decodes to is then
            # known before it is decoded (`_decode_text`).
            dictionary = [] if self.ids else [self.column]
            with pq.ParquetFile(self.path, read_dictionary=dictionary) as f:
                yield from self._row_groups(f)
        except BaseException:  # refused, failed, or abandoned: nothing is kept
            self.held.free()
            raise

    def footer(self) -> tuple[int, int, int]:
        """(rows, row groups, values) of the column, as its footer says."""
        import pyarrow.parquet as pq

        with pq.ParquetFile(self.path) as f:
            meta = f.metadata
            values = sum(
                max(0, c.num_values)
                for g in range(meta.num_row_groups)
                for c in self._chunks(meta.row_group(g))
            )
            return meta.num_rows, meta.num_row_groups, values

    def _chunks(self, meta) -> list:
        return [
            meta.column(i)
            for i in range(meta.num_columns)
            if meta.column(i).path_in_schema.split(".")[0] == self.column
        ]

    def _row_groups(self, f) -> Iterator[list]:
        import pyarrow as pa

        first = 0
        for g in range(f.num_row_groups):
            cancel.check()  # a large file takes a while; the client may have left
            meta = f.metadata.row_group(g)
            rows = meta.num_rows
            where = f"row group {g} (rows {first}-{first + rows - 1})"
            # Ids are kept as read: reserved in `held` at once. Text's indices are dropped
            # once decoded: reserved apart, given back after.
            encoded = self.held if self.ids else self._transient
            pages = self._check_pages(meta, where)
            try:
                self._reserve_encoded(meta, encoded, where, pages)
                try:
                    column = f.read_row_group(g, columns=[self.column]).column(self.column)
                except (OSError, pa.ArrowException) as e:
                    raise CorruptFileError(
                        f"{self.name} {where}: cannot read ({said(e, self.path, self.name)})."
                    ) from e
                if self.ids:
                    # What it took past the footer's estimate (a footer that undercounts).
                    self._grow(column.nbytes - self._estimate, where)
                    arrays = column.chunks
                else:
                    arrays = [self._decode_text(column, where)]
            finally:
                if encoded is not self.held:
                    encoded.free()
            del column
            yield arrays
            first += rows

    def _reserve_encoded(self, meta, into: Reservation, where: str, pages: int) -> None:
        """Reserves what the row group's column takes before it is read: encoded (the
        footer's uncompressed size, or its `pages`' if more; text read as dictionary indices
        holds no more), and for ids what they decode to (8 bytes a value at most, an offset a
        row)."""
        chunks = self._chunks(meta)
        need = max(pages, sum(max(0, c.total_uncompressed_size) for c in chunks))
        if self.ids:
            values = sum(
                max(0, c.num_values) * _ID_BYTES.get(c.physical_type, _ID_BYTES_MAX) for c in chunks
            )
            need = max(need, values + (meta.num_rows + 1) * _OFFSET_BYTES)
        self._estimate = need
        if not into.grow(need, self.limit):
            raise self._over(need, where)

    def _check_pages(self, meta, where: str) -> int:
        """The bytes the row group's pages decompress to, by their headers; a text row group
        is refused when a page's values' mean (less what else it holds) is past
        --max-document-mb: one of its documents is. (Ids decode to about what they take
        encoded, reserved before they are read; each row is checked as it is read.)"""
        pages = []
        with open(self.path, "rb") as f:
            for c in self._chunks(meta):
                first = c.dictionary_page_offset if c.has_dictionary_page else None
                first = c.data_page_offset if first is None else first
                pages += chunk_pages(f, first, max(0, c.total_compressed_size), self.name)
        if self.max_document is not None and not self.ids:
            mean = max(
                ((p.uncompressed - _SLACK_PER_VALUE * p.values) // max(1, p.values) for p in pages),
                default=0,
            )
            shown = f"{self.name} {where}, column {self.column!r} (a document, by its page headers)"
            check_size(mean, self.max_document, shown)
        return sum(p.uncompressed for p in pages)

    def _grow(self, more: int, where: str) -> None:
        if more > 0 and not self.held.grow(more, self.limit):
            raise self._over(more, where)

    def _decode_text(self, column, where: str):
        """A row group's text decoded from its dictionary indices, once what it decodes to
        (the lengths its indices select, and an offset a row) is reserved."""
        import pyarrow as pa
        import pyarrow.compute as pc

        need = (len(column) + 1) * 4
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                need += chunk.nbytes
                continue
            lengths = pc.binary_length(chunk.dictionary).fill_null(0).to_numpy()
            indices = chunk.indices.fill_null(0).to_numpy()
            need += int(lengths[indices].sum()) if len(indices) and len(lengths) else 0
        self._grow(need, where)
        decoded = [
            c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in column.chunks
        ]
        if len(decoded) == 1:
            return decoded[0]
        if not decoded:
            return pa.array([], pa.string())
        return pa.concat_arrays(decoded)

    def _over(self, size: int, where: str) -> OverBudgetError:
        """Refused: this file's column alone is past the limit (splitting it helps: each
        file's column is held whole only while read), or what is held cannot be given back
        now (columns other streams are reading this moment; idle ones were given back)."""
        limit = self.limit or 0
        flag = limit / _MIB
        mine = self.held.bytes + self._transient.bytes
        head = (
            f"{self.name} {where}: column {self.column!r} would take {size / _MIB:,.1f} MB "
            f"more in memory decoded ({mine / _MIB:,.1f} MB of this file so far"
        )
        if mine + size > limit:
            return OverBudgetError(
                f"{head}), past the server's --max-decompressed-mb {flag:g} by itself (a "
                f"Parquet column is held whole in memory, decoded, while its file is read); "
                f"split the file into files whose column decodes to under {flag:g} MB each, "
                f"or ask the operator for a larger limit."
            )
        others = DECOMPRESSED.held - mine
        return OverBudgetError(
            f"{head}; {others / _MIB:,.1f} MB of other files held now that cannot be given "
            f"back yet: Parquet columns being read at this moment, .gz/.zst text of open "
            f"streams), over the server's --max-decompressed-mb {flag:g} (idle Parquet columns "
            f"are given back first); try again when those streams end, or ask the operator "
            f"for a larger limit."
        )


def largest_text(array) -> int:
    """The longest value of an arrow string array, in bytes (0 for none): a row's size known
    before it is made a Python string (a 381 MB cell was copied twice more before)."""
    import pyarrow.compute as pc

    if len(array) == 0:
        return 0
    longest = pc.max(pc.binary_length(array)).as_py()
    return int(longest or 0)


def _within(values, limit: int | None):
    """`values` with each one longer than `limit` bytes made null."""
    import pyarrow.compute as pc

    if limit is None or largest_text(values) <= limit:
        return values
    return pc.if_else(pc.less_equal(pc.binary_length(values), limit), values, None)
