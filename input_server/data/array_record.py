"""ArrayRecord files (json, text or tf.train.Example records): random access to each record's
text, or to its token ids (`token_field`). Picklable; each opens its file lazily in the process
that reads, through `OPEN_FILES` (a bounded number open per process)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from input_server.data.jsonl import json_ids
from input_server.data.records import OPEN_FILES, check_size, loads_json, said, text_of
from input_server.data.tf_example import example_ids, example_text
from input_server.errors import InvalidSpecError, RecordError


class ArrayRecordReader:
    """ArrayRecord files; each record is a JSON object, UTF-8 text or a tf.train.Example. With
    a `token_field`, a record's token ids (int64 arrays): a JSON list of integers or an Example's
    `int64_list`; `text_field` is then unused."""

    max_bytes: int | None = None

    def __init__(
        self,
        path: str,
        text_field: str,
        record_format: str,
        *,
        token_field: str | None = None,
        name: str | None = None,
    ):
        self.path = path
        self.name = path if name is None else name  # in messages: the path as written
        self.text_field = text_field
        self.record_format = record_format
        self.token_field = token_field
        if token_field is not None and record_format == "text":
            raise InvalidSpecError(
                f"`source.token_field` {token_field!r} is set, but {self.name} is read with "
                f"`source.record_format` 'text', whose records are text, not token ids; use "
                f"record_format 'json' or 'tf_example' for pre-tokenized records, or leave "
                f"token_field unset to tokenize the text."
            )
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

    def read_many(self, indices: Sequence[int]) -> list[str] | list[np.ndarray]:
        """The texts (or ids) of many records, read in one call."""
        try:
            with self._open() as reader:
                raws = reader.read(list(indices))
        except RuntimeError:  # a corrupt chunk: find and name the record
            return [self[i] for i in indices]
        return [self._decode(raw, i) for raw, i in zip(raws, indices, strict=True)]

    def __getitem__(self, index: int) -> str | np.ndarray:
        try:
            with self._open() as reader:
                raw = reader.read([index])[0]
        except RuntimeError as e:
            raise RecordError(
                f"{self.where(index)}: cannot read ({said(e, self.path, self.name)})."
            ) from e
        return self._decode(raw, index)

    def _decode(self, raw: bytes, index: int) -> str | np.ndarray:
        where = self.where(index)
        check_size(len(raw), self.max_bytes, where)
        try:
            if self.token_field is not None:
                if self.record_format == "json":
                    return json_ids(raw, self.token_field, where)
                return example_ids(raw, self.token_field, where)
            if self.record_format == "text":
                return raw.decode("utf-8")
            if self.record_format == "json":
                return text_of(loads_json(raw), self.text_field, where)
            return example_text(raw, self.text_field, where)
        except UnicodeDecodeError as e:
            raise RecordError(f"{where}: not valid UTF-8 ({e}).") from e
        except ValueError as e:
            raise RecordError(f"{where}: not valid JSON ({e}).") from e
