"""Packing: documents from a token stream into MaxText-format batches.

Every batch is built from the documents that follow the previous batch's last one, so the
position `(doc, offset)` reached after a batch is the whole resume state: it does not depend on
how many workers tokenized the documents.

Speed: placement is decided with plain Python integers per document (no per-token Python
work), each document is a slice (a view) of its group's token array, and the batch is one
`np.concatenate` of those views and the padding. Segment ids, positions and targets are not
built here: they follow from the segment lengths (`PackedBatch.arrays()`; the client derives
them from the wire the same way).

Long documents (`batch.long_documents`) are cut by the cursor, not the packers: a packer places
pieces, and a piece of a chunked document is a document like any other to it. So the hot loops
are the same for every policy, and a chunked document cut at a batch's end leaves the cursor
at `(doc, offset)` inside it with every packing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from input_client.wire import compact_arrays, expand_packed
from input_server.data.tokenizers import TokenGroup
from input_server.errors import InvalidSpecError

LONG_DOCUMENTS = ("trim", "chunk", "split")


class DocCursor:
    """Walks the pieces of the documents of a stream of `TokenGroup`s.

    A piece is what the packers place as one document: with `long_documents="trim"` a document's
    first `seq_len` tokens, with "chunk" each `seq_len` tokens of it (the last piece shorter; an
    empty document has none, as MaxText's `TokenizeAndChunk` gives none), with "split" (or None)
    the whole document, which first_fit and none trim and concat_then_split runs on from row to
    row. `index` is the current piece of `group` (`starts`, `lengths`: its pieces) and
    `offset` how many of its tokens were already used (only `concat_then_split` cuts a piece
    across rows); `at()` gives the position in documents, which resume states carry.
    """

    def __init__(
        self,
        groups: Iterator[TokenGroup],
        doc: int = 0,
        offset: int = 0,
        *,
        long_documents: str | None = None,
        seq_len: int = 0,
    ):
        if long_documents not in (None, *LONG_DOCUMENTS):
            raise ValueError(
                f"`batch.long_documents` must be trim, chunk or split, got {long_documents!r}."
            )
        if long_documents in ("trim", "chunk") and seq_len < 1:
            raise ValueError(
                f"`batch.seq_len` must be positive to {long_documents}, got {seq_len}."
            )
        self._groups = groups
        self._cut = seq_len if long_documents in ("trim", "chunk") else 0
        self._chunk = long_documents == "chunk"
        self._doc = doc
        self._pending = offset  # the resume state's offset, placed when its group arrives
        self.offset = 0
        self.group: TokenGroup | None = None
        self.starts: list[int] = []
        self.lengths: list[int] = []
        self.index = 0  # of the current piece within `group`
        # Chunked groups only (else a piece is its document): each piece's document (within
        # the group) and its first token's offset in it.
        self._piece_doc: list[int] | None = None
        self._piece_offset: list[int] | None = None

    @property
    def doc(self) -> int:
        """The ordinal of the current document in the stream."""
        g = self.group
        if g is None:
            return self._doc
        if self._piece_doc is None:
            return g.first_doc + self.index
        i = self.index
        return g.first_doc + (self._piece_doc[i] if i < len(self._piece_doc) else len(g.lengths))

    def at(self) -> tuple[int, int]:
        """`(doc, offset)`: the current document and how many of its tokens were used; a
        cursor made at this position walks the same pieces from here."""
        if self.group is None:
            return self._doc, self._pending
        i, offset = self.index, self.offset
        if self._piece_offset is not None and i < len(self._piece_offset):
            offset += self._piece_offset[i]
        return self.doc, offset

    def load(self) -> bool:
        """Makes `group` hold the current piece; False once the stream has ended."""
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
            self.group = g
            self._pieces(g, doc - g.first_doc)
        return True

    def _pieces(self, g: TokenGroup, i: int) -> None:
        """Cuts group `g` into pieces; the current one is that of document `i` at the pending
        offset. Per group, in numpy: no per-document Python work unless a document is cut."""
        lengths, cut = g.lengths, self._cut
        self._piece_doc = self._piece_offset = None
        if (
            not cut
            or not len(lengths)
            or (int(lengths.max()) <= cut and (not self._chunk or int(lengths.min()) > 0))
        ):
            self.lengths, self.starts = lengths.tolist(), g.starts.tolist()
            self._place(i, lengths, i)
        elif not self._chunk:  # trim: a view of each long document's first `cut` tokens
            trimmed = np.minimum(lengths, cut)
            self.lengths, self.starts = trimmed.tolist(), g.starts.tolist()
            self._place(i, trimmed, i)
        else:
            counts = -(-lengths // cut)  # pieces per document: 0 for an empty one
            first = np.cumsum(counts) - counts
            doc_of = np.repeat(np.arange(len(lengths)), counts)
            piece_offset = (np.arange(len(doc_of)) - first[doc_of]) * cut
            self.starts = (g.starts[doc_of] + piece_offset).tolist()
            self.lengths = np.minimum(lengths[doc_of] - piece_offset, cut).tolist()
            self._piece_doc, self._piece_offset = doc_of.tolist(), piece_offset.tolist()
            piece = int(first[i]) + self._pending // cut if i < len(lengths) else len(doc_of)
            self._place(i, lengths, piece)

    def _place(self, i: int, lengths: np.ndarray, piece: int) -> None:
        """Makes `piece` current: the one of document `i` that holds the pending offset, which
        must lie inside the document (`lengths`: the documents' tokens, trimmed under trim)."""
        self.index, pending = piece, self._pending
        if not pending or i >= len(lengths):
            return  # a state at a group's end: its offset is for the next group's first document
        if pending >= lengths[i]:
            # Only a resume state gives an offset at a group's start (the packers move on at
            # a piece's end): one past its document would make other batches under the same
            # sequence numbers.
            raise InvalidSpecError(
                f"`resume_state` offset {pending} is past the {int(lengths[i])} tokens of "
                f"document {self.group.first_doc + i}."
            )
        self._pending = 0
        self.offset = pending % self._cut if self._chunk else pending


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
    """Builds the next batch from the cursor's pieces; None once no piece is left.

    A piece is a document as the cursor's `long_documents` cuts it (`DocCursor`): trimmed, one
    `seq_len` chunk of it, or whole.
    first_fit: pieces (trimmed to `seq_len`) go, in order, into the first row with room; the
      batch is done when a piece fits no row, and that piece opens the next batch.
    concat_then_split: pieces fill rows end to end; a piece cut at a row's end continues in
      the next row as a new segment (positions restart there).
    none: one piece per row, trimmed or padded.
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
