"""Document sources: every record of every file a spec names (a mixture's components one after
another), as one random-access source for Grain (`DocumentSource`) of texts, or of token-id
arrays for pre-tokenized files, over a reader per file (each format's: `formats`).
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence

import numpy as np

from input_client.formats import FORMATS
from input_client.spec import SourceSpec
from input_server import cancel
from input_server.data.formats import READERS
from input_server.data.jsonl import NotJsonError
from input_server.data.records import Reader
from input_server.data.roots import OPERATOR, DataAccess, keyed
from input_server.errors import (
    CorruptFileError,
    InvalidSpecError,
    RecordError,
    UnreadableError,
    shorten,
)


def open_reader(
    path: str,
    spec: SourceSpec,
    max_document_bytes: int | None = None,
    *,
    max_decompressed_bytes: int | None = None,
    name: str | None = None,
) -> Reader:
    """The reader of one file; a compressed one (or a Parquet column) is decompressed only while
    the process holds at most `max_decompressed_bytes` decompressed (`records.DECOMPRESSED`:
    all streams, all files).
    Its messages call it `name` (the path as the client wrote it; default `path`).

    Raises:
      InvalidSpecError: the spec's format has no reader (a spec that passed validation names
        one of `input_client.formats`, each of which has one).
    """
    opener = READERS.get(spec.format)
    if opener is None:
        raise InvalidSpecError(
            f"`source.format` {spec.format!r} has no reader on this server; it reads "
            f"{', '.join(READERS)}."
        )
    reader = opener(path, spec, max_decompressed_bytes, name)
    reader.max_bytes = max_document_bytes
    return reader


def _refuse_repeats(key: str, files: list[tuple[str, str]]) -> None:
    """Refuses a component that names one file more than once (by any path or glob): each copy
    would be read as more documents (40,000 copies of a 20,000-document file are 800 M, whose
    order alone took a server's memory). More of a file is a mixture component's weight."""
    counts = collections.Counter(real for real, _ in files)
    real, times = counts.most_common(1)[0] if counts else ("", 1)
    if times > 1:
        names = list(dict.fromkeys(w for r, w in files if r == real))
        also = f" (as {', '.join(repr(shorten(n)) for n in names[:3])})" if len(names) > 1 else ""
        raise InvalidSpecError(
            f"`{key}.paths` name the file {shorten(names[0])!r} {times:,} times{also}; name "
            f"each file once (for more of one file, give it its own mixture component and a "
            f"weight)."
        )


def _does_not_fit(key: str, spec: SourceSpec, name: str, e: RecordError) -> InvalidSpecError:
    """A file's first record failing: the spec's keys that decide how it is read, and the
    reader's reason."""
    if not FORMATS[spec.format].reads:  # no fields: a record is the document
        keys = f"format={spec.format!r}"
    else:
        field = (
            f"token_field={spec.token_field!r}"
            if spec.token_field
            else f"text_field={spec.text_field!r}"
        )
        keys = f"format={spec.format!r}, {field}, record_format={spec.record_format!r}"
    # A first line that is not JSON: most likely plain text under a name the format was not
    # inferred from.
    hint = (
        '; plain text, a document a line, is format = "text"' if isinstance(e, NotJsonError) else ""
    )
    return InvalidSpecError(f"`{key}` does not fit {name} ({keys}): {e}{hint}")


class DocumentSource:
    """All documents of all files, in file order: a Grain random-access data source of texts
    (or id arrays). A mixture's components follow one another: component c's records are
    `components[c]` (start, count) of it."""

    def __init__(self, readers: Sequence[Reader], components: Sequence[tuple[int, int]] = ()):
        self._readers = list(readers)
        self._ends = np.cumsum([len(r) for r in self._readers]).tolist()
        self.components = list(components) or [(0, len(self))]

    @classmethod
    def from_spec(
        cls, spec: SourceSpec | Sequence[SourceSpec], access: DataAccess = OPERATOR
    ) -> DocumentSource:
        """Opens every file the spec names (that `access` allows) and checks the first record
        of each can be read. A component naming a file twice is refused; a file two components
        name is opened once (its reader shared), each counted in the order's budget. Several
        specs (a mixture's components) are opened one after another; messages name them
        `source[i]`.

        Raises:
          DataNotFoundError: a path or glob names no file.
          InvalidSpecError: the text field is missing from the first record, nothing to read,
            or a component names one file twice.
          RecordError: a file is not of the format the spec says.
          OverBudgetError: its compressed files would take what the process holds decompressed
            past --max-decompressed-mb.
        """
        specs = [spec] if isinstance(spec, SourceSpec) else list(spec)
        keys = (
            ["source"]
            if isinstance(spec, SourceSpec)
            else [f"source[{i}]" for i in range(len(specs))]
        )
        try:
            return cls._open(specs, keys, access)
        except PermissionError as e:
            raise UnreadableError(
                f"`source.paths`: the server may not read {e.filename or e} (permission denied)."
            ) from e

    @classmethod
    def _open(cls, specs: list[SourceSpec], keys: list[str], access: DataAccess) -> DocumentSource:
        opened: dict[tuple, Reader] = {}
        try:
            readers, components = [], []
            each = access.expand_each([spec.paths for spec in specs], keys)
            for spec, key, files in zip(specs, keys, each, strict=True):
                with keyed(key):
                    part = cls._open_into(opened, spec, key, files, access)
                start = sum(len(r) for r in readers)
                components.append((start, sum(len(r) for r in part)))
                readers.extend(part)
            return cls(readers, components)
        except BaseException:  # cancelled or refused: the files opened so far close now
            for r in opened.values():
                r.close()
            raise

    @classmethod
    def _open_into(
        cls,
        opened: dict[tuple, Reader],
        spec: SourceSpec,
        key: str,
        files: list[tuple[str, str]],
        access: DataAccess,
    ) -> list[Reader]:
        _refuse_repeats(key, files)
        readers = []
        # A file two components read alike is opened once.
        fields = (spec.format, spec.text_field, spec.token_field, spec.record_format)
        mine = []
        for p, written in files:
            cancel.check()
            if (p, fields) not in opened:
                try:
                    opened[p, fields] = open_reader(
                        p,
                        spec,
                        access.max_document_bytes,
                        max_decompressed_bytes=access.max_decompressed_bytes,
                        name=written,
                    )
                except PermissionError:
                    raise UnreadableError(
                        f"`{key}.paths`: the server may not read {written} (permission denied)."
                    ) from None
                mine.append(opened[p, fields])
            readers.append(opened[p, fields])
        for r in mine:
            if len(r):
                try:
                    r[0]
                except CorruptFileError:  # a damaged file is DATA_LOSS, not a spec mistake
                    raise
                except RecordError as e:  # the first record failing is a spec mistake
                    raise _does_not_fit(key, spec, r.name, e) from e
        if sum(len(r) for r in readers) == 0:
            raise InvalidSpecError(f"`{key}.paths` {list(spec.paths)!r} hold no records.")
        return readers

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def files(self) -> list[str]:
        """Each reader's file, in the order its records are numbered."""
        return [r.path for r in self._readers]

    def release(self) -> None:
        """Closes every file's descriptors and maps now, keeping what is in memory; they
        open again if read."""
        for r in {id(r): r for r in self._readers}.values():
            r.release()

    def close(self) -> None:
        """`release`, and drops what the readers hold in memory (decompressed text, giving its
        bytes back to --max-decompressed-mb; loaded columns)."""
        for r in {id(r): r for r in self._readers}.values():
            r.close()

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
        """The texts of many records, in the order given, read file by file in bulk; a record
        named twice (a short source repeating within a group) read once, its text shared."""
        listed = np.asarray(indices, np.int64).tolist()
        if len(set(listed)) < len(listed):
            unique, inverse = np.unique(listed, return_inverse=True)
            texts = self.read_many(unique)
            return [texts[i] for i in inverse.tolist()]
        if len(self._readers) == 1:  # one file (most sources): no file to find for each
            return self._readers[0].read_many(listed)
        indices = np.asarray(listed, np.int64)
        files = np.searchsorted(self._ends, indices, side="right")
        out: list[str | None] = [None] * len(indices)
        for f in np.unique(files).tolist():
            where = np.flatnonzero(files == f)
            first = self._ends[f - 1] if f else 0
            local = (indices[where] - first).tolist()
            texts = self._readers[f].read_many(local)
            for slot, text in zip(where.tolist(), texts, strict=True):
                out[slot] = text
        return out
