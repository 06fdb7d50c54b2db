"""What every tokenizer kind makes of a group of documents (`TokenGroup`), and cutting long
documents before tokenizing them (`Cutter`), for any kind whose pieces never span a space."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class TokenGroup:
    """The tokens of consecutive documents: `tokens[starts[i]:starts[i] + lengths[i]]` is doc i.

    `first_doc` is the ordinal of doc 0 in the stream, used to resume mid-group.
    """

    first_doc: int
    tokens: np.ndarray  # int32, all documents concatenated
    lengths: np.ndarray  # int64, tokens per document
    # Whether the group was audited against the reference tokenizer, and found to differ
    # (its tokens are then the reference's).
    audited: bool = False
    mismatched: bool = False
    # Whether the serving backend failed on it (an error, a panic): the reference's tokens.
    fell_back: bool = False
    # Whether a fast backend encoded it (audited or not): the groups an audit could verify.
    by_backend: bool = False

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    def to_element(self) -> dict[str, np.ndarray]:
        """A Grain element: a dict of arrays, which Grain's worker processes hand over through
        shared memory (a dataclass would be pickled through a pipe, and a group of several MB
        left in a pipe keeps a worker from exiting when its stream closes)."""
        return {
            "first_doc": np.int64(self.first_doc),
            "tokens": self.tokens,
            "lengths": self.lengths,
            "audit": np.asarray(
                [self.audited, self.mismatched, self.fell_back, self.by_backend], np.int8
            ),
        }

    @classmethod
    def from_element(cls, element: dict[str, np.ndarray]) -> TokenGroup:
        """The group of a Grain element. A worker process's arrays arrive as Grain's
        `SharedMemoryArray`, an ndarray subclass whose every slice runs Python of its own: the
        packer takes a slice a document, so they are read through plain ndarray views (the
        shared memory lives on as the views' base)."""
        return cls(
            first_doc=int(element["first_doc"]),
            tokens=element["tokens"].view(np.ndarray),
            lengths=element["lengths"].view(np.ndarray),
            audited=bool(element["audit"][0]),
            mismatched=bool(element["audit"][1]),
            fell_back=bool(element["audit"][2]),
            by_backend=bool(element["audit"][3]),
        )

    def same_ids(self, other: TokenGroup) -> bool:
        return np.array_equal(self.lengths, other.lengths) and np.array_equal(
            self.tokens, other.tokens
        )


def group_of(ids: list[np.ndarray], first_doc: int, trim_to: int | None) -> TokenGroup:
    """The group of documents whose int32 ids are `ids`, each trimmed to `trim_to` tokens."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if trim_to is not None:
        for i in np.flatnonzero(lengths > trim_to).tolist():
            ids[i] = ids[i][:trim_to]
        np.minimum(lengths, trim_to, out=lengths)
    tokens = np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, np.int32)
    return TokenGroup(first_doc=first_doc, tokens=tokens, lengths=lengths)


def joined(groups: list[TokenGroup]) -> TokenGroup:
    """Consecutive groups as one: the first's `first_doc`, every audit flag any of them set."""
    if len(groups) == 1:
        return groups[0]
    return TokenGroup(
        first_doc=groups[0].first_doc,
        tokens=np.concatenate([g.tokens for g in groups]),
        lengths=np.concatenate([g.lengths for g in groups]),
        audited=all(g.audited for g in groups if g.by_backend),
        mismatched=any(g.mismatched for g in groups),
        fell_back=any(g.fell_back for g in groups),
        by_backend=any(g.by_backend for g in groups),
    )


def framed(
    flat: np.ndarray, offsets: np.ndarray, head: list[int], tail: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The texts whose bare ids are `flat[offsets[i]:offsets[i + 1]]` (uint32 or int32), `head`
    put before and `tail` after each: one int32 array and where each text starts (n + 1
    offsets), without an array per text (`backends.Backend.encode_framed`'s answer)."""
    flat = flat.view(np.int32) if flat.dtype == np.uint32 else flat.astype(np.int32, copy=False)
    h, t = len(head), len(tail)
    if not h and not t:
        return flat, offsets
    bare = np.diff(offsets).astype(np.int64)
    lengths = bare + (h + t)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    tokens = np.empty(int(lengths.sum()), np.int32)
    body = np.ones(len(tokens), bool)  # a mask, not an index a token: 2-3x cheaper
    for j, x in enumerate(head):
        tokens[starts + j], body[starts + j] = x, False
    for j, x in enumerate(tail):
        tokens[starts + h + bare + j], body[starts + h + bare + j] = x, False
    tokens[body] = flat[offsets[0] : offsets[-1]]
    return tokens, np.concatenate([np.zeros(1, np.int64), ends])


def flat_group(
    flat: np.ndarray,
    offsets: np.ndarray,
    head: list[int],
    tail: list[int],
    first_doc: int,
    trim_to: int | None,
) -> TokenGroup:
    """The group of documents whose bare ids are `flat[offsets[i]:offsets[i + 1]]` (uint32 or
    int32), `head` and `tail` added to each and each trimmed to `trim_to` tokens, as
    `group_of` makes it from per-document arrays, without an array per document."""
    flat, offsets = framed(flat, offsets, head, tail)
    lengths = np.diff(offsets).astype(np.int64)
    tokens = flat[offsets[0] : offsets[-1]]
    if trim_to is not None and len(lengths) and lengths.max() > trim_to:
        starts = np.cumsum(lengths) - lengths
        keep = np.arange(len(tokens)) - np.repeat(starts, lengths) < trim_to
        tokens, lengths = tokens[keep], np.minimum(lengths, trim_to)
    return TokenGroup(first_doc=first_doc, tokens=tokens, lengths=lengths)


# A document that will be trimmed to `n` tokens is cut (at a space) before tokenizing: a
# tokenizer's time is per character (sentencepiece's, measured), and a long document's tail
# would be thrown away. The cut keeps a margin times the characters that `n` tokens took on
# average (learned from a sample of the data, then from every group; CUT_CHARS_PER_TOKEN before
# any). A prefix that proves to hold too few tokens grows at a further space, sized from its own
# characters per token. The cut only saves work: the tokens kept are the same either way.
# Growing by tokenizing only the added text (BPE, word and char models) is cheap, so a small
# margin pays; growing by tokenizing the longer prefix again (unigram models) costs more per
# miss. Each margin tokenized the fewest characters per epoch of pydoc topics in a sweep done
# while writing this (scripts/bench/bench_tokenize.py reports the characters tokenized).
CUT_CHARS_PER_TOKEN = 8.0
CUT_MARGIN_GROW_ADDED = 1.05
CUT_MARGIN_RETOKENIZE = 1.25

# Stretches without a place to cut, for a Cutter cutting at every space: runs of `_RUN`+
# characters without one.
_RUN = 4096
_LONG_RUN = re.compile(rf"[^ ]{{{_RUN},}}")

# A kind's batch call: texts in, each text's int32 ids out, BOS and EOS as the flags say.
Encode = Callable[..., list[np.ndarray]]


class Cutter:
    """Cuts long documents at a space before tokenizing, for a model whose pieces never span a
    space (so the tokens of a text's whole words do not depend on the words after them), and
    learns the data's characters per token to size the cuts.

    Args:
      extendable: the text after a space, tokenized alone, gives the tokens it has inside the
        whole text: a prefix that proved too short grows by tokenizing only what follows it
        (else the longer prefix is tokenized again).
      bos, eos: whether the kind adds BOS and EOS to each document; `eos_id` is the EOS.
      at: whether a space (its index in the text) is a place to cut; None: every space.
      places: a pattern matching (at least) every space `at` allows: how the longest stretch
        without a place to cut is found (`longest_uncut`); None with `at`: not known.
    """

    learns = True  # sizes its cuts by the data's characters per token
    # Spaces looked at for a place to cut before giving up (the text is then tokenized whole,
    # or to its end): a text of spaces where `at` never holds costs no more than this.
    LOOK = 64

    def __init__(
        self,
        *,
        extendable: bool,
        bos: bool,
        eos: bool,
        eos_id: int,
        at: Callable[[str, int], bool] | None = None,
        places: re.Pattern | None = None,
    ):
        self.extendable, self.at, self.places = extendable, at, places
        self.bos, self.eos, self.eos_id = bos, eos, eos_id
        self.chars_per_token = CUT_CHARS_PER_TOKEN
        self._groups_learned = 0

    @property
    def margin(self) -> float:
        return CUT_MARGIN_GROW_ADDED if self.extendable else CUT_MARGIN_RETOKENIZE

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        """About how many of a document's `text_chars` characters get tokenized when the
        packer keeps `trim_to` of its tokens (see CUT_MARGIN_*)."""
        if trim_to is None:
            return text_chars
        return min(text_chars, int(trim_to * self.margin * self.chars_per_token))

    def cuts(self, texts: list[str], trim_to: int) -> bool:
        """Whether any of `texts` is long enough to be cut before tokenizing."""
        limit = int(trim_to * self.margin * self.chars_per_token)
        return any(len(t) > limit for t in texts)

    def longest_uncut(self, text: str, trim_to: int) -> int:
        """The longest stretch of `text` between two places to cut (at most all of it): the
        most a cut prefix's growing may tokenize at once (whatever `trim_to`)."""
        if self.at is None:
            return max((m.end() - m.start() for m in _LONG_RUN.finditer(text)), default=_RUN)
        if self.places is None:  # no pattern finds its places: the whole text
            return len(text)
        last, most = 0, 0
        for m in self.places.finditer(text):
            if self.at(text, m.start()):  # the pattern finds a few more than `at` allows
                most, last = max(most, m.start() - last), m.start()
        return max(most, len(text) - last)

    def first_cut(self, text: str, trim_to: int) -> int:
        """The characters of `text` tokenized first: up to the last place to cut within the
        limit, or all of them where there is none (a line with no space)."""
        limit = int(trim_to * self.margin * self.chars_per_token)
        if len(text) <= limit:
            return len(text)
        space = self._before(text, 0, limit)
        return space if space > 0 else len(text)

    def learn(self, texts: list[str], ids: list[np.ndarray]) -> None:
        """Folds this group's characters per token into the running estimate."""
        tokens = sum(map(len, ids)) - (self.bos + self.eos) * len(ids)
        if tokens > 1000:
            self._groups_learned += 1
            w = max(0.2, 1 / self._groups_learned)
            self.chars_per_token += w * (sum(map(len, texts)) / tokens - self.chars_per_token)

    def encode(self, encode: Encode, texts: list[str], trim_to: int) -> list[np.ndarray]:
        """Encodes `texts` with `encode(texts, add_bos=..., add_eos=...)`, each long one cut at
        a space first (see CUT_MARGIN_*). A prefix that proves to hold fewer than `trim_to`
        tokens grows, at a further space, until it holds enough or the document is whole."""
        work = list(texts)
        ends: dict[int, int] = {}  # documents cut short: where their tokenized text ends
        for i, text in enumerate(texts):
            end = self.first_cut(text, trim_to)
            if end < len(text):
                work[i], ends[i] = text[:end], end
        ids = encode(work, add_bos=self.bos, add_eos=self.eos)
        self.learn(work, ids)
        if not ends:
            return ids
        bos, eos = int(self.bos), int(self.eos)
        # A cut document's tokens so far, without the EOS its prefix was given: all of them
        # are the whole document's first tokens.
        body = {i: ids[i][: len(ids[i]) - eos] for i in ends}
        short = [i for i in ends if len(body[i]) < trim_to]
        while short:
            pieces = []
            for i in short:
                text, start = texts[i], ends[i]
                # Characters for the missing tokens at this prefix's own rate, with margin.
                rate = start / max(1, len(body[i]) - bos)
                end = start + max(64, int((trim_to - len(body[i])) * self.margin * rate))
                if end < len(text):
                    space = self._before(text, start + 1, end)
                    end = space if space > start else self._after(text, end)
                ends[i] = end = len(text) if end < 0 or end >= len(text) else end
                pieces.append(text[start:end] if self.extendable else text[:end])
            add_bos = bool(bos) and not self.extendable
            for i, x in zip(short, encode(pieces, add_bos=add_bos, add_eos=False), strict=True):
                body[i] = np.concatenate([body[i], x]) if self.extendable else x
            short = [i for i in short if len(body[i]) < trim_to and ends[i] < len(texts[i])]
        for i, b in body.items():
            ids[i] = np.append(b, np.int32(self.eos_id)) if eos and ends[i] == len(texts[i]) else b
        return ids

    def _before(self, text: str, lo: int, hi: int) -> int:
        """The last place to cut in `text[lo:hi]`, or -1."""
        space = text.rfind(" ", lo, hi)
        if self.at is None:
            return space
        for _ in range(self.LOOK):
            if space < 0 or self.at(text, space):
                return space
            space = text.rfind(" ", lo, space)
        return -1

    def _after(self, text: str, lo: int) -> int:
        """The first place to cut in `text[lo:]`, or -1."""
        space = text.find(" ", lo)
        if self.at is None:
            return space
        for _ in range(self.LOOK):
            if space < 0 or self.at(text, space):
                return space
            space = text.find(" ", space + 1)
        return -1
