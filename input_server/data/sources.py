"""Document sources: every record's text of every file a spec names, as one random-access
source of strings for Grain (`DocumentSource`), over a reader per file (`jsonl`, `columnar`).
"""

from __future__ import annotations

import bisect
import glob
import os
from collections.abc import Sequence

import numpy as np

from input_client.spec import SourceSpec
from input_server.data.columnar import ArrayRecordReader, ParquetReader
from input_server.data.jsonl import JsonlReader
from input_server.data.records import Reader
from input_server.errors import (
    CorruptFileError,
    DataNotFoundError,
    InvalidSpecError,
    RecordError,
    UnreadableError,
)

_GLOB_CHARS = frozenset("*?[")


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
