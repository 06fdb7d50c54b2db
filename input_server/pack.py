"""Packing: documents from a token stream into MaxText-format batches.

Every batch is built from the documents that follow the previous batch's last one, so the
position `(doc, offset)` reached after a batch is the whole resume state: it does not depend on
how many workers tokenized the documents.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from input_server.tokenize import TokenGroup

FIELDS = ("inputs", "inputs_segmentation", "inputs_position",
          "targets", "targets_segmentation", "targets_position")


class DocCursor:
    """Walks the documents of a stream of `TokenGroup`s.

    `doc` is the ordinal of the current document in the stream and `offset` how many of its
    tokens were already used (only `concat_then_split` splits a document across rows).
    """

    def __init__(self, groups: Iterator[TokenGroup], doc: int = 0, offset: int = 0):
        self._groups = groups
        self.doc = doc
        self.offset = offset
        self._group: TokenGroup | None = None
        self._starts: np.ndarray | None = None

    def peek(self) -> np.ndarray | None:
        """The current document's unused tokens, or None when the stream has ended."""
        while True:
            g = self._group
            if g is not None and self.doc < g.first_doc + len(g.lengths):
                i = self.doc - g.first_doc
                start = int(self._starts[i])
                return g.tokens[start + self.offset:start + int(g.lengths[i])]
            g = next(self._groups, None)
            if g is None:
                return None
            self._group, self._starts = g, g.starts

    def advance(self) -> None:
        """Moves to the next document (whatever of this one is left is dropped)."""
        self.doc += 1
        self.offset = 0

    def consume(self, n: int) -> None:
        """Uses `n` more tokens of the current document, moving on when it is used up."""
        remaining = len(self.peek())
        if n >= remaining:
            self.advance()
        else:
            self.offset += n


def _shift_left(a: np.ndarray) -> np.ndarray:
    out = np.zeros_like(a)
    out[:, :-1] = a[:, 1:]
    return out


def with_targets(inputs: np.ndarray, seg: np.ndarray, pos: np.ndarray) -> dict[str, np.ndarray]:
    """MaxText's batch: targets are the inputs shifted left by one; padding stays 0 everywhere."""
    return {
        "inputs": inputs,
        "inputs_segmentation": seg,
        "inputs_position": pos,
        "targets": _shift_left(inputs),
        "targets_segmentation": _shift_left(seg),
        "targets_position": _shift_left(pos),
    }


def pack_batch(cursor: DocCursor, *, size: int, seq_len: int,
               packing: str) -> dict[str, np.ndarray] | None:
    """Builds the next batch from the cursor's documents; None once no document is left.

    first_fit: documents (trimmed to `seq_len`) go, in order, into the first row with room; the
      batch is done when a document fits no row, and that document opens the next batch.
    concat_then_split: documents fill rows end to end; a document cut at a row's end continues
      in the next row as a new segment (positions restart there).
    none: one document per row, trimmed or padded.
    The last batch of a finite stream may have empty (all-padding) rows.
    """
    inputs = np.zeros((size, seq_len), np.int32)
    seg = np.zeros((size, seq_len), np.int32)
    pos = np.zeros((size, seq_len), np.int32)
    arange = np.arange(seq_len, dtype=np.int32)
    placed = False
    if packing == "first_fit":
        free = np.full(size, seq_len)
        segments = np.zeros(size, np.int32)
        while (toks := cursor.peek()) is not None:
            n = min(len(toks), seq_len)
            if n == 0:
                cursor.advance()
                continue
            fits = free >= n
            if not fits.any():
                break
            r = int(np.argmax(fits))
            o = seq_len - int(free[r])
            segments[r] += 1
            inputs[r, o:o + n] = toks[:n]
            seg[r, o:o + n] = segments[r]
            pos[r, o:o + n] = arange[:n]
            free[r] -= n
            cursor.advance()
            placed = True
    elif packing == "concat_then_split":
        for r in range(size):
            o, segment = 0, 0
            while o < seq_len and (toks := cursor.peek()) is not None:
                n = min(len(toks), seq_len - o)
                if n:
                    segment += 1
                    inputs[r, o:o + n] = toks[:n]
                    seg[r, o:o + n] = segment
                    pos[r, o:o + n] = arange[:n]
                    o += n
                    placed = True
                cursor.consume(n)
            if o < seq_len:  # the stream ended inside this row
                break
    elif packing == "none":
        for r in range(size):
            toks = cursor.peek()
            if toks is None:
                break
            n = min(len(toks), seq_len)
            inputs[r, :n] = toks[:n]
            seg[r, :n] = 1
            pos[r, :n] = arange[:n]
            cursor.advance()
            placed = True
    else:
        raise ValueError(f"`batch.packing` must be first_fit, concat_then_split or none, "
                         f"got {packing!r}.")
    return with_targets(inputs, seg, pos) if placed else None
