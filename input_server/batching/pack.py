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
from typing import Any

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
        heads: dict[int, int] | None = None,
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
        # Documents whose first tokens were used before this stream (ordinal -> tokens): the
        # resume state's own, and a resharded stream's documents other hosts began
        # (`data.elastic`). Each is skipped as if the stream had resumed there.
        self._heads = dict(heads or {})
        if offset:
            self._heads[doc] = max(offset, self._heads.get(doc, 0))
        self.offset = 0
        self.group: TokenGroup | None = None
        self.starts: list[int] = []
        self.lengths: list[int] = []
        self.index = 0  # of the current piece within `group`
        # Chunked groups and groups holding a head only (else a piece is its whole document):
        # each piece's document (within the group) and its first token's offset in it.
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
        doc, offset, i = self.doc, 0, self.index
        if self.group is not None:
            offset = self.offset
            if self._piece_offset is not None and i < len(self._piece_offset):
                offset += self._piece_offset[i]
        return doc, max(offset, self._heads.get(doc, 0)) if self._heads else offset

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
            self.offset = 0
            self._pieces(g, doc - g.first_doc)
        return True

    def _pieces(self, g: TokenGroup, i: int) -> None:
        """Cuts group `g` into pieces; the current one is document `i`'s first. Per group, in
        numpy: no per-document Python work unless a document is cut or has a head."""
        lengths, cut = g.lengths, self._cut
        self._piece_doc = self._piece_offset = None
        heads = self._heads_in(g) if self._heads else {}
        if heads or (cut and self._chunk and len(lengths) and not self._whole(lengths)):
            self._cut_pieces(g, i, heads)
            return
        if cut and len(lengths) and int(lengths.max()) > cut:  # trim: each one's first tokens
            lengths = np.minimum(lengths, cut)
        self.lengths, self.starts = lengths.tolist(), g.starts.tolist()
        self.index = i

    def _whole(self, lengths: np.ndarray) -> bool:
        """Whether every document of a chunked group is one piece."""
        return int(lengths.max()) <= self._cut and int(lengths.min()) > 0

    def _heads_in(self, g: TokenGroup) -> dict[int, int]:
        """The heads of `g`'s documents (index in the group -> tokens used), checked."""
        first, n = g.first_doc, len(g.lengths)
        out = {x - first: h for x, h in self._heads.items() if first <= x < first + n and h}
        kept = g.lengths if not self._cut or self._chunk else np.minimum(g.lengths, self._cut)
        for d, h in out.items():
            if h >= kept[d]:
                # Only a resume state names an offset at a piece's start (the packers move on at
                # a piece's end): one past its document would make other batches under the same
                # sequence numbers.
                raise InvalidSpecError(
                    f"`resume_state` offset {h} is past the {int(kept[d])} tokens of "
                    f"document {first + d}."
                )
        return out

    def _cut_pieces(self, g: TokenGroup, i: int, heads: dict[int, int]) -> None:
        """Pieces with their documents and offsets: chunks of `cut` tokens under chunk (an
        empty document has none), else one a document (trimmed under trim); a document with a
        head starts past it (whole chunks before it dropped)."""
        lengths, cut = g.lengths, self._cut
        if self._chunk:
            counts = -(-lengths // cut)  # pieces per document: 0 for an empty one
        else:
            counts = np.ones(len(lengths), np.int64)
            lengths = np.minimum(lengths, cut) if cut else lengths
        first = np.cumsum(counts) - counts
        doc_of = np.repeat(np.arange(len(lengths)), counts)
        offset = (np.arange(len(doc_of)) - first[doc_of]) * (cut if self._chunk else 0)
        size = lengths[doc_of] - offset
        if self._chunk:
            size = np.minimum(size, cut)
        starts = g.starts[doc_of] + offset
        if heads:
            d = np.fromiter(heads, np.int64, len(heads))
            h = np.fromiter(heads.values(), np.int64, len(heads))
            skip = np.zeros(len(lengths), np.int64)
            skip[d] = h
            used = np.clip(skip[doc_of] - offset, 0, size)  # each piece's tokens used
            keep = (used == 0) | (used < size)  # an empty document's piece stays
            starts, offset = (starts + used)[keep], (offset + used)[keep]
            size, doc_of = (size - used)[keep], doc_of[keep]
        self.starts, self.lengths = starts.tolist(), size.tolist()
        self._piece_doc, self._piece_offset = doc_of.tolist(), offset.tolist()
        self.index = int(np.searchsorted(doc_of, i))


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


@dataclasses.dataclass(frozen=True)
class Produced:
    """One packed batch with its sequence number and the resume state after it."""

    seq: int
    batch: PackedBatch
    state: dict[str, Any]

    @property
    def num_tokens(self) -> int:
        return self.batch.num_tokens

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """MaxText's six arrays (derived from the compact batch on each access)."""
        return self.batch.arrays()


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
