"""Parquet files: random access to each row's text, or to its token ids (`token_field`), from
the column loaded into memory (`parquet_load`). Picklable; the file is open only while its
column loads, in the process that reads."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterable, Sequence

import numpy as np

from input_server import stages
from input_server.data.parquet_load import ColumnLoad, Texts
from input_server.data.records import DECODED, check_size, said
from input_server.errors import CorruptFileError, InvalidSpecError, RecordError


@dataclasses.dataclass(frozen=True)
class _Ids:
    """A token-id column in memory: row i's ids are `values[offsets[i]:offsets[i + 1]]`."""

    offsets: np.ndarray  # int64, one more than the rows
    values: np.ndarray  # int32 or int64 as stored; read-only, handed out as views
    bad: np.ndarray | None  # per row: null, or holding a null id; None: no row is
    null_ids: np.ndarray | None  # per id: null (read as 0); None: no id is


def _is_ids(kind) -> bool:
    import pyarrow as pa

    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and kind.value_type in (
        pa.int32(),
        pa.int64(),
    )


class ParquetReader:
    """Parquet files; the text column (or, with a `token_field`, a column of token ids: a list
    of int32 or int64 per row) is loaded for random access and held in `records.DECODED`:
    given back, least recently used first, when another file's column needs the room (read
    again, it loads again, the same rows)."""

    max_bytes: int | None = None

    def __init__(
        self,
        path: str,
        text_field: str,
        *,
        token_field: str | None = None,
        name: str | None = None,
        max_decompressed: int | None = None,
    ):
        import pyarrow.parquet as pq

        self.path = path
        self.name = path if name is None else name  # in messages: the path as written
        self.text_field = text_field
        self.token_field = token_field
        # The loaded column is held decoded within --max-decompressed-mb (`parquet_load`).
        self.max_decompressed = max_decompressed
        self._lock = threading.Lock()
        try:
            with pq.ParquetFile(path) as meta:  # closed now, not when collected
                schema, self._len = meta.schema_arrow, meta.metadata.num_rows
        except Exception as e:
            raise RecordError(
                f"{self.name}: not a readable Parquet file ({said(e, path, self.name)})."
            ) from e
        key, column = (
            ("text_field", text_field) if token_field is None else ("token_field", token_field)
        )
        if column not in schema.names:
            raise InvalidSpecError(
                f"`source.{key}` {column!r} is not a column of {self.name} "
                f"(columns: {', '.join(schema.names)})."
            )
        kind = schema.field(column).type
        if token_field is not None and not _is_ids(kind):
            raise InvalidSpecError(
                f"`source.token_field` {column!r}: column {column!r} of {self.name} is of type "
                f"{kind}, not token ids (list<int32> or list<int64>, or their large_list); "
                f"store the ids as such, or name the text column in `source.text_field` and "
                f"leave token_field unset."
            )

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._len

    def where(self, index: int) -> str:
        return f"{self.name} row {index}"

    def release(self) -> None:
        """Nothing to close: the file is open only while its column loads."""

    def close(self) -> None:
        """Drops the loaded column now (or, if being read, once read; loaded again if read),
        giving its bytes back to --max-decompressed-mb."""
        DECODED.close(self)

    @contextlib.contextmanager
    def _loaded(self):
        """A context holding the column in memory (`DECODED`): the texts (`Texts`, an arrow
        array a row group), or the ids (`_Ids`); not given back to another file while held."""
        with contextlib.ExitStack() as stack:
            # One load at a time: a second thread waits and shares it, rather than loading
            # a second copy (which a tight budget could refuse).
            with self._lock:
                column, _ = stack.enter_context(DECODED.use(self, self._load, _free))
            yield column

    @stages.timed("decompress")  # a Parquet column is decompressed and decoded in one go
    def _load(self):
        """(column, its reservation), each row group reserved before it is decoded
        (`parquet_load`)."""
        load = ColumnLoad(
            self.path,
            self.name,
            self.token_field or self.text_field,
            ids=self.token_field is not None,
            limit=self.max_decompressed,
            max_document=self.max_bytes,
        )
        try:
            if self.token_field is None:
                column = Texts(load.load())  # the file is closed once the column is loaded
            else:
                rows, groups, values = load.footer()
                # Copied out a row group at a time: one row group of arrow memory at once.
                column = _ids(load.each() if groups > 1 else [load.load()], rows, values)
        except BaseException:
            load.held.free()
            raise
        return column, load.held

    def read_many(self, indices: Sequence[int]) -> list[str] | list[np.ndarray]:
        """The texts (or ids) of many rows, taken in one vectorized call; ids are read-only
        views of the column (no copy, no work per id)."""
        if self.token_field is not None:
            return self._read_ids(indices)
        try:
            with self._loaded() as column:
                texts = column.take(indices, self.max_bytes)
        except UnicodeDecodeError:  # find and name the row
            return [self[i] for i in indices]
        limit = self.max_bytes or float("inf")
        return [
            t if type(t) is str and len(t) <= limit else self[i]
            for t, i in zip(texts, indices, strict=True)
        ]

    def _read_ids(self, indices: Sequence[int]) -> list[np.ndarray]:
        # The views handed out keep the values alive past an eviction until the batch is
        # packed (copied): a bounded, short overlap.
        with self._loaded() as ids:
            return self._views(ids, indices)

    def _views(self, ids: _Ids, indices: Sequence[int]) -> list[np.ndarray]:
        rows = np.asarray(indices, np.int64).reshape(-1)
        rows = np.where(rows < 0, rows + self._len, rows)
        if rows.size and (rows.min() < 0 or rows.max() >= self._len):
            raise IndexError(f"{self.name}: a row index is out of range (0-{self._len - 1}).")
        starts, ends = ids.offsets[rows], ids.offsets[rows + 1]
        if (ids.bad is not None and ids.bad[rows].any()) or (
            self.max_bytes is not None and ((ends - starts) * _ID_BYTES > self.max_bytes).any()
        ):
            return [self[i] for i in indices]  # raises, naming the row
        values = ids.values
        return [values[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]

    def __getitem__(self, index: int) -> str | np.ndarray:
        if self.token_field is not None:
            return self._row_ids(index)
        try:
            with self._loaded() as column:  # its size checked before it is a Python string
                check_size(column.size(index), self.max_bytes, self.where(index))
                text = column[index].as_py()
        except UnicodeDecodeError as e:
            raise RecordError(f"{self.where(index)}: not valid UTF-8 ({e}).") from e
        if not isinstance(text, str):
            raise RecordError(
                f"{self.where(index)}: column {self.text_field!r} holds "
                f"{type(text).__name__}, not a string."
            )
        return text

    def _row_ids(self, index: int) -> np.ndarray:
        with self._loaded() as ids:
            return self._row(ids, index)

    def _row(self, ids: _Ids, index: int) -> np.ndarray:
        row = index + self._len if index < 0 else index
        if not 0 <= row < self._len:
            raise IndexError(f"{self.name}: row {index} is out of range (0-{self._len - 1}).")
        start, end = int(ids.offsets[row]), int(ids.offsets[row + 1])
        if ids.bad is not None and ids.bad[row]:
            nulls = np.flatnonzero(ids.null_ids[start:end]) if ids.null_ids is not None else ()
            what = f"holds a null at position {int(nulls[0])}" if len(nulls) else "is null"
            raise RecordError(
                f"{self.where(row)}: column {self.token_field!r} {what}, not a list of token ids."
            )
        check_size((end - start) * _ID_BYTES, self.max_bytes, self.where(row))
        return ids.values[start:end]


def _free(loaded) -> None:
    loaded[1].free()


# What an id takes for the size bound: an int32, as the batches hold it.
_ID_BYTES = 4


def _ids(groups: Iterable[list], rows: int, capacity: int) -> _Ids:
    """A column of lists of ids (arrow arrays, a list a row group, `rows` in all) as numpy:
    64-bit offsets (a file may hold over 2**31 ids, past a list's int32 offsets), the values
    (no copy if one array; else copied out a row group at a time into one buffer of the
    footer's `capacity` values), and which rows are null or hold a null id."""
    offsets = np.zeros(rows + 1, np.int64)
    bad, nulls = np.zeros(rows, bool), []  # nulls: (first id, mask) of each array
    values = _Values(capacity)
    row = base = 0
    for arrays in groups:
        for a in arrays:
            if row + len(a) > rows:
                raise CorruptFileError(f"the file holds more rows than its footer says ({rows}).")
            at = a.offsets.to_numpy().astype(np.int64)  # into a.values, which a slice shares
            child = a.values.slice(int(at[0]), int(at[-1] - at[0]))
            at -= at[0]
            offsets[row + 1 : row + len(a) + 1] = at[1:] + base
            if a.null_count:
                bad[row : row + len(a)] |= a.is_null().to_numpy(zero_copy_only=False)
            if child.null_count:  # mark their rows, and give numpy a buffer without gaps
                mask = child.is_null().to_numpy(zero_copy_only=False)
                bad[row + np.searchsorted(at, np.flatnonzero(mask), side="right") - 1] = True
                nulls.append((base, mask))
                child = child.fill_null(0)
            values.add(child.to_numpy(zero_copy_only=True))
            row, base = row + len(a), base + len(child)
    values = values.array()
    values.flags.writeable = False  # shared by every document read: none may change it
    null_ids = None
    if nulls:
        null_ids = np.zeros(base, bool)
        for first, mask in nulls:
            null_ids[first : first + len(mask)] = mask
    return _Ids(offsets, values, bad if bad.any() else None, null_ids)


class _Values:
    """The ids of a column's arrays, in order: the one array as is (no copy), or each copied
    into one buffer as it comes (so the arrays it came from can go)."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._first: np.ndarray | None = None
        self._buf: np.ndarray | None = None
        self._n = 0

    def add(self, part: np.ndarray) -> None:
        if self._first is None and self._buf is None:
            self._first, self._n = part, len(part)
            return
        if self._buf is None:
            first, self._first = self._first, None
            self._buf = np.empty(max(self._capacity, self._n + len(part)), part.dtype)
            self._buf[: self._n] = first
        if self._n + len(part) > len(self._buf):  # a footer that undercounts
            self._buf = np.concatenate([self._buf[: self._n], np.empty(len(part), part.dtype)])
        self._buf[self._n : self._n + len(part)] = part
        self._n += len(part)

    def array(self) -> np.ndarray:
        if self._buf is not None:
            return self._buf[: self._n]
        return self._first if self._first is not None else np.zeros(0, np.int64)
