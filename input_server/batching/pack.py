"""Packing: documents from a token stream into MaxText-format batches.

Every batch is built from the documents that follow the previous batch's last one, so the
position `(doc, offset)` reached after a batch is the whole resume state: it does not depend on
how many workers tokenized the documents.

Speed: placement is decided with plain Python integers per document (no per-token Python
work), each document is a slice (a view) of its group's token array, and the batch is one
`np.concatenate` of those views and the padding. Segment ids, positions and targets are not
built here: they follow from the segment lengths (`PackedBatch.arrays()`; the client derives
them from the wire the same way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from input_client.wire import compact_arrays, expand_packed
from input_server.data.tokenizer import TokenGroup
from input_server.errors import InvalidSpecError


class DocCursor:
    """Walks the documents of a stream of `TokenGroup`s.

    `doc` is the ordinal of the current document in the stream and `offset` how many of its
    tokens were already used (only `concat_then_split` splits a document across rows).
    """

    def __init__(self, groups: Iterator[TokenGroup], doc: int = 0, offset: int = 0):
        self._groups = groups
        self.offset = offset
        self._doc = doc
        self.group: TokenGroup | None = None
        self.starts: list[int] = []
        self.lengths: list[int] = []
        self.index = 0  # of the current document within `group`

    @property
    def doc(self) -> int:
        return self.group.first_doc + self.index if self.group is not None else self._doc

    def load(self) -> bool:
        """Makes `group` hold the current document; False once the stream has ended."""
        while self.group is None or self.index >= len(self.lengths):
            doc = self.doc
            g = next(self._groups, None)
            if g is None:
                self._doc = doc
                self.group = None
                return False
            if not g.first_doc <= doc <= g.first_doc + len(g.lengths):
                raise ValueError(
                    f"token group starting at document {g.first_doc} does not hold document {doc}."
                )
            self.group, self.index = g, doc - g.first_doc
            self.lengths = g.lengths.tolist()
            self.starts = g.starts.tolist()
            i = self.index
            if self.offset and i < len(self.lengths) and self.offset >= self.lengths[i]:
                # Only a resume state gives an offset at a group's start (the packers move
                # on at a document's end): one past its document would make other batches
                # under the same sequence numbers.
                raise InvalidSpecError(
                    f"`resume_state` offset {self.offset} is past the {self.lengths[i]} tokens of "
                    f"document {doc}."
                )
        return True


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """A batch in compact form: each row is its segments end to end, then padding.

    `inputs` is [size, seq_len] int32; `segment_lengths` lists every row's segment lengths, row
    after row, and `segments_per_row` how many belong to each row. `arrays()` gives MaxText's
    six arrays (the client derives them the same way from the wire).
    """

    inputs: np.ndarray
    segment_lengths: np.ndarray
    segments_per_row: np.ndarray

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int(self.segment_lengths.sum())

    def compact(self, vocab_size: int | None = None) -> dict[str, np.ndarray]:
        """The arrays the wire carries (`wire.compact_arrays`)."""
        return compact_arrays(self.inputs, self.segment_lengths, self.segments_per_row, vocab_size)

    def arrays(self) -> dict[str, np.ndarray]:
        return expand_packed(self.inputs, self.segment_lengths, self.segments_per_row)


class _Rows:
    """The batch being built: per row, the token slices of its segments, in order."""

    def __init__(self, size: int, seq_len: int):
        self.size, self.seq_len = size, seq_len
        self.pieces: list[list[np.ndarray]] = [[] for _ in range(size)]
        self.placed = False

    def add(self, row: int, piece: np.ndarray) -> None:
        self.pieces[row].append(piece)
        self.placed = True

    def batch(self) -> PackedBatch | None:
        if not self.placed:
            return None
        seq_len = self.seq_len
        zeros = np.zeros(seq_len, np.int32)
        flat: list[np.ndarray] = []
        lengths: list[int] = []
        per_row: list[int] = []
        for row in self.pieces:  # per row, not per piece: C loops over the pieces
            first = len(lengths)
            lengths.extend(map(len, row))
            flat.extend(row)
            flat.append(zeros[: seq_len - sum(lengths[first:])])
            per_row.append(len(row))
        # One copy of every token into place: the rows' pieces and padding, end to end.
        inputs = np.concatenate(flat).reshape(self.size, seq_len)
        return PackedBatch(inputs, np.array(lengths, np.int32), np.array(per_row, np.int32))


def _first_fit(cursor: DocCursor, out: _Rows) -> None:
    # The hot loop of a stream with short documents (a few hundred per row): plain ints and
    # lists, names bound locally, one slice per document placed.
    size, seq_len = out.size, out.seq_len
    free = [seq_len] * size
    pieces = out.pieces
    while cursor.load():
        tokens, starts, lengths = cursor.group.tokens, cursor.starts, cursor.lengths
        i, count = cursor.index, len(lengths)
        most = max(free)  # no row has more room: a longer document opens the next batch
        while i < count:
            n = lengths[i]
            if n > seq_len:
                n = seq_len
            if n == 0:
                i += 1
                continue
            if n > most:
                cursor.index = i
                return
            r = 0
            while free[r] < n:
                r += 1
            start = starts[i]
            pieces[r].append(tokens[start : start + n])
            out.placed = True
            if free[r] == most:
                free[r] -= n
                most = max(free)
            else:
                free[r] -= n
            i += 1
        cursor.index = i


def _concat_then_split(cursor: DocCursor, out: _Rows) -> None:
    seq_len = out.seq_len
    row, fill = 0, 0
    while row < out.size and cursor.load():
        tokens, starts, lengths = cursor.group.tokens, cursor.starts, cursor.lengths
        i, count = cursor.index, len(lengths)
        while i < count and row < out.size:
            remaining = lengths[i] - cursor.offset
            n = min(remaining, seq_len - fill)
            if n > 0:
                start = starts[i] + cursor.offset
                out.add(row, tokens[start : start + n])
                fill += n
            if n >= remaining:
                i += 1
                cursor.offset = 0
            else:
                cursor.offset += n
            if fill == seq_len:
                row, fill = row + 1, 0
        cursor.index = i


def _one_per_row(cursor: DocCursor, out: _Rows) -> None:
    seq_len = out.seq_len
    row = 0
    while row < out.size and cursor.load():
        tokens, starts, lengths = cursor.group.tokens, cursor.starts, cursor.lengths
        i, count = cursor.index, len(lengths)
        while i < count and row < out.size:
            n = min(lengths[i], seq_len)
            if n:
                out.add(row, tokens[starts[i] : starts[i] + n])
            out.placed = True  # an empty document still takes its row
            row += 1
            i += 1
        cursor.index = i


_PACKERS = {"first_fit": _first_fit, "concat_then_split": _concat_then_split, "none": _one_per_row}


def pack_batch(cursor: DocCursor, *, size: int, seq_len: int, packing: str) -> PackedBatch | None:
    """Builds the next batch from the cursor's documents; None once no document is left.

    first_fit: documents (trimmed to `seq_len`) go, in order, into the first row with room; the
      batch is done when a document fits no row, and that document opens the next batch.
    concat_then_split: documents fill rows end to end; a document cut at a row's end continues
      in the next row as a new segment (positions restart there).
    none: one document per row, trimmed or padded.
    The last batch of a finite stream may have empty (all-padding) rows.
    """
    packer = _PACKERS.get(packing)
    if packer is None:
        raise ValueError(
            f"`batch.packing` must be first_fit, concat_then_split or none, got {packing!r}."
        )
    out = _Rows(size, seq_len)
    packer(cursor, out)
    return out.batch()
