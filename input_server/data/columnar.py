"""ArrayRecord (json, text or tf.train.Example records) and Parquet files: random access to
each record's text. Picklable; each opens its file lazily in the process that reads, ArrayRecord
through `OPEN_FILES` (a bounded number open per process), Parquet only while it loads."""

from __future__ import annotations

from collections.abc import Sequence

from input_server.data.records import OPEN_FILES, check_size, loads_json, said, text_of
from input_server.errors import CorruptFileError, InvalidSpecError, RecordError


class ArrayRecordReader:
    """ArrayRecord files; each record is a JSON object, UTF-8 text or a tf.train.Example."""

    max_bytes: int | None = None

    def __init__(self, path: str, text_field: str, record_format: str, *, name: str | None = None):
        self.path = path
        self.name = path if name is None else name  # in messages: the path as written
        self.text_field = text_field
        self.record_format = record_format
        try:
            reader = self._new()
            try:
                # A file that is not ArrayRecord opens with 0 records and `ok()` false.
                if not reader.ok():
                    raise ValueError("the reader reports a corrupt file")
                self._len = reader.num_records()
            finally:
                reader.close()
        except Exception as e:
            raise RecordError(
                f"{self.name}: not a readable ArrayRecord file ({said(e, path, self.name)})."
            ) from e

    def _new(self):
        from array_record.python import array_record_module

        # No readahead: the pipeline reads in shuffled order.
        return array_record_module.ArrayRecordReader(self.path, "readahead_buffer_size:0")

    def _open(self):
        """A context holding the file's reader open (`OPEN_FILES`)."""
        return OPEN_FILES.use(self, self._new, lambda reader: reader.close())

    def release(self) -> None:
        """Closes the file's reader now; a later read opens it again."""
        OPEN_FILES.close(self)

    close = release

    def __len__(self) -> int:
        return self._len

    def where(self, index: int) -> str:
        return f"{self.name} record {index}"

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The texts of many records, read in one call."""
        try:
            with self._open() as reader:
                raws = reader.read(list(indices))
        except RuntimeError:  # a corrupt chunk: find and name the record
            return [self[i] for i in indices]
        return [self._decode(raw, i) for raw, i in zip(raws, indices, strict=True)]

    def __getitem__(self, index: int) -> str:
        try:
            with self._open() as reader:
                raw = reader.read([index])[0]
        except RuntimeError as e:
            raise RecordError(
                f"{self.where(index)}: cannot read ({said(e, self.path, self.name)})."
            ) from e
        return self._decode(raw, index)

    def _decode(self, raw: bytes, index: int) -> str:
        where = self.where(index)
        check_size(len(raw), self.max_bytes, where)
        try:
            if self.record_format == "text":
                return raw.decode("utf-8")
            if self.record_format == "json":
                return text_of(loads_json(raw), self.text_field, where)
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

    max_bytes: int | None = None

    def __init__(self, path: str, text_field: str, *, name: str | None = None):
        import pyarrow.parquet as pq

        self.path = path
        self.name = path if name is None else name  # in messages: the path as written
        self.text_field = text_field
        self._column = None
        try:
            with pq.ParquetFile(path) as meta:  # closed now, not when collected
                names, self._len = meta.schema_arrow.names, meta.metadata.num_rows
        except Exception as e:
            raise RecordError(
                f"{self.name}: not a readable Parquet file ({said(e, path, self.name)})."
            ) from e
        if text_field not in names:
            raise InvalidSpecError(
                f"`source.text_field` {text_field!r} is not a column of {self.name} "
                f"(columns: {', '.join(names)})."
            )

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_column"] = None
        return state

    def __len__(self) -> int:
        return self._len

    def where(self, index: int) -> str:
        return f"{self.name} row {index}"

    def release(self) -> None:
        """Nothing to close: the file is open only while its column loads."""

    def close(self) -> None:
        """Drops the loaded column now (loaded again if read)."""
        self._column = None

    def _texts(self):
        if self._column is None:
            import pyarrow.parquet as pq

            with pq.ParquetFile(self.path) as f:  # closed once the column is in memory
                self._column = self._load(f)
        return self._column

    def _load(self, f):
        import pyarrow as pa

        chunks, first = [], 0
        for g in range(f.num_row_groups):
            rows = f.metadata.row_group(g).num_rows
            try:
                chunks.append(
                    f.read_row_group(g, columns=[self.text_field]).column(self.text_field)
                )
            except (OSError, pa.ArrowException) as e:
                raise CorruptFileError(
                    f"{self.name} row group {g} (rows {first}-{first + rows - 1}): "
                    f"cannot read ({said(e, self.path, self.name)})."
                ) from e
            first += rows
        return pa.chunked_array([c for ch in chunks for c in ch.chunks]).combine_chunks()

    def read_many(self, indices: Sequence[int]) -> list[str]:
        """The texts of many rows, taken in one vectorized call."""
        try:
            texts = self._texts().take(indices).to_pylist()
        except UnicodeDecodeError:  # find and name the row
            return [self[i] for i in indices]
        limit = self.max_bytes or float("inf")
        return [
            t if type(t) is str and len(t) <= limit else self[i]
            for t, i in zip(texts, indices, strict=True)
        ]

    def __getitem__(self, index: int) -> str:
        try:
            text = self._texts()[index].as_py()
        except UnicodeDecodeError as e:
            raise RecordError(f"{self.where(index)}: not valid UTF-8 ({e}).") from e
        if not isinstance(text, str):
            raise RecordError(
                f"{self.where(index)}: column {self.text_field!r} holds "
                f"{type(text).__name__}, not a string."
            )
        # Characters, a lower bound of the bytes: the column is in memory already.
        check_size(len(text), self.max_bytes, self.where(index))
        return text
