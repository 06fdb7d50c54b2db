"""Pre-tokenized documents: ids checked against the vocabulary, BOS/EOS added as the tokenizer
adds them to text, trimmed as text is; and a group that mixes texts and ids.

From here on a group of ids is a group of tokens like any other, so packing makes the same
batches of the same ids, whether they came as text or pre-tokenized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from input_client.spec import TokenizerSpec
from input_server.data.tokenizer import TokenGroup
from input_server.errors import RecordError


@dataclasses.dataclass(frozen=True)
class Specials:
    """What surrounds every document, and the ids that are valid."""

    vocab_size: int
    bos: int | None  # None: nothing prepended
    eos: int | None
    written: str  # the vocabulary's origin, for messages (the model as written, or the key)


class IdsOnly:
    """The tokenizer of a spec without a model (every source pre-tokenized): its vocabulary is
    `tokenizer.vocab_size`, its specials `bos_id`/`eos_id`. Texts never reach it (validation
    requires a model for text)."""

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self.vocab_size = spec.vocab_size
        self.written = "`tokenizer.vocab_size`"

    def specials(self) -> Specials:
        t = self.spec
        return Specials(
            vocab_size=t.vocab_size,
            bos=t.bos_id if t.add_bos else None,
            eos=t.eos_id if t.add_eos else None,
            written=f"`tokenizer.vocab_size` {t.vocab_size}",
        )

    def learn_chars_per_token(self, texts: list[str]) -> float:
        return 0.0

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        return text_chars

    def encode(self, texts, first_doc=0, num_threads=1, trim_to=None) -> TokenGroup:
        raise TypeError("a spec without `tokenizer.model` has no text to tokenize")


def model_specials(tokenizer) -> Specials:
    """The specials of a sentencepiece `Tokenizer` (an id the model lacks, -1, adds nothing,
    as sentencepiece's own `add_bos` does)."""
    sp, t = tokenizer.processor(), tokenizer.spec
    bos, eos = sp.bos_id(), sp.eos_id()
    return Specials(
        vocab_size=sp.vocab_size(),
        bos=bos if t.add_bos and bos >= 0 else None,
        eos=eos if t.add_eos and eos >= 0 else None,
        written=f"`tokenizer.model` {tokenizer.written!r} ({sp.vocab_size()} ids)",
    )


def _checked(ids: np.ndarray, specials: Specials, where: Callable[[], str]) -> None:
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= specials.vocab_size):
        bad = ids[(ids < 0) | (ids >= specials.vocab_size)]
        at = int(np.flatnonzero((ids < 0) | (ids >= specials.vocab_size))[0])
        raise RecordError(
            f"{where()}: token id {int(bad[0])} (position {at}) is outside the vocabulary of "
            f"{specials.written}: ids run from 0 to {specials.vocab_size - 1}."
        )


def id_parts(
    docs: Sequence[np.ndarray],
    specials: Specials,
    *,
    trim_to: int | None,
    where: Callable[[int], str],
) -> list[list[np.ndarray]]:
    """Each document's tokens as text would give them, in parts (views, no copy): BOS, the ids,
    EOS, of which the first `trim_to`; ids outside the vocabulary are DATA_LOSS naming file,
    record and id."""
    for i, ids in enumerate(docs):
        _checked(ids, specials, lambda i=i: where(i))
    bos = np.array([specials.bos], np.int32) if specials.bos is not None else None
    eos = np.array([specials.eos], np.int32) if specials.eos is not None else None
    room = trim_to if trim_to is not None else np.iinfo(np.int64).max
    out = []
    for ids in docs:
        left = room
        parts = []
        for part in (bos, ids, eos):
            if part is not None and left > 0:
                parts.append(part[:left] if len(part) > left else part)
                left -= len(parts[-1])
        out.append(parts)
    return out


def encode_documents(
    tokenizer,
    specials: Specials | None,
    items: Sequence[str | np.ndarray],
    *,
    first_doc: int,
    trim_to: int | None,
    where: Callable[[int], str],
) -> TokenGroup:
    """One group's tokens: texts tokenized in one call, ids passed through `id_parts`, in
    the documents' order. `where(i)` names item i's record for messages."""
    text_at = [i for i, x in enumerate(items) if isinstance(x, str)]
    if len(text_at) == len(items):
        return tokenizer.encode(list(items), first_doc=first_doc, num_threads=1, trim_to=trim_to)
    parts: list[list[np.ndarray]] = [[] for _ in items]
    if text_at:
        texts = tokenizer.encode(
            [items[i] for i in text_at], first_doc=0, num_threads=1, trim_to=trim_to
        )
        for i, start, n in zip(text_at, texts.starts.tolist(), texts.lengths.tolist(), strict=True):
            parts[i] = [texts.tokens[start : start + n]]
    ids_at = [i for i, x in enumerate(items) if not isinstance(x, str)]
    made = id_parts(
        [items[i] for i in ids_at], specials, trim_to=trim_to, where=lambda k: where(ids_at[k])
    )
    for i, p in zip(ids_at, made, strict=True):
        parts[i] = p
    lengths = np.fromiter((sum(len(x) for x in p) for p in parts), dtype=np.int64, count=len(parts))
    flat = [x for p in parts for x in p]
    # One copy, cast as it is made: ids stored as int64 become the wire's int32 (checked below
    # the vocabulary, which is below 2^31).
    tokens = (
        np.concatenate(flat, dtype=np.int32, casting="unsafe") if flat else np.zeros(0, np.int32)
    )
    return TokenGroup(first_doc=first_doc, tokens=tokens, lengths=lengths)
