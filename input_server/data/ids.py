"""Pre-tokenized documents: ids checked against the vocabulary, BOS/EOS added as the tokenizer
adds them to text, trimmed as text is; and a group that mixes texts and ids.

From here on a group of ids is a group of tokens like any other, so packing makes the same
batches of the same ids, whether they came as text or pre-tokenized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import Specials, TokenGroup, Tokenizer
from input_server.data.tokenizers.backends import Choice
from input_server.data.tokenizers.memory import encode_bounded
from input_server.errors import RecordError


class IdsOnly:
    """The tokenizer of a spec without a model (every source pre-tokenized; `base.Tokenizer`):
    its vocabulary is `tokenizer.vocab_size`, its specials `bos_id`/`eos_id`. Texts never
    reach it (validation requires a model for text), so nobody tokenizes: no choice, no audit.
    """

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self.vocab_size = spec.vocab_size
        self.written = "`tokenizer.vocab_size`"
        self.choice: Choice | None = None  # no model: nobody tokenizes
        self.audit_share = 0.0  # written by the producer each batch; nothing to audit

    def choose_backend(self, documents: list[str]) -> Choice | None:
        return None

    def fall_back(self, why: str) -> None:
        pass  # no backend serves

    def trials(self) -> tuple[int, bool]:
        return 0, False  # nobody tokenizes: nothing on trial

    def digest(self) -> str:
        return ""  # no model file

    def library_version(self) -> str:
        return "none"  # no library tokenizes

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

    def memory_bytes(self, text: str, trim_to: int | None) -> int:
        return 0  # nothing is tokenized (`encode` refuses text)

    def encode(self, texts, first_doc=0, trim_to=None) -> TokenGroup:
        raise TypeError("a spec without `tokenizer.model` has no text to tokenize")


def _check_range(flat: np.ndarray, lengths: np.ndarray, specials: Specials, where) -> None:
    """Refuses the first id outside the vocabulary (of all documents' ids end to end, no
    specials among them), naming its document's record: one vectorized pass over the group."""
    if not len(flat) or (0 <= int(flat.min()) and int(flat.max()) < specials.vocab_size):
        return
    at = int(np.flatnonzero((flat < 0) | (flat >= specials.vocab_size))[0])
    doc = int(np.searchsorted(np.cumsum(lengths), at, side="right"))
    within = at - int(lengths[:doc].sum())
    raise RecordError(
        f"{where(doc)}: token id {int(flat[at])} (position {within}) is outside the vocabulary "
        f"of {specials.written}: ids run from 0 to {specials.vocab_size - 1}."
    )


def joined_ids(
    docs: Sequence[np.ndarray],
    specials: Specials,
    *,
    trim_to: int | None,
    where: Callable[[int], str],
) -> tuple[np.ndarray, np.ndarray]:
    """Every document's tokens as text would give them, end to end in one int32 array: BOS,
    the ids, EOS, of which the first `trim_to`; with each document's token count. The ids are
    joined by one copy and the specials set around them in one pass (a document of ~80 ids
    cost more in its own appends and parts than in copying). Ids outside the vocabulary are
    DATA_LOSS naming file, record and id."""
    n = len(docs)
    lengths = np.fromiter(map(len, docs), dtype=np.int64, count=n)
    if docs and not all(d.dtype == np.int32 for d in docs):
        # Wider ids are checked before the cast to int32 could wrap them; int32 ones are
        # checked once joined, saving a copy of the group.
        _check_range(np.concatenate(docs), lengths, specials, where)
    room = trim_to if trim_to is not None else np.iinfo(np.int64).max
    bos = specials.bos is not None and room >= 1
    body = np.minimum(lengths, max(0, room - bos))
    eos = (lengths + bos + 1 <= room) if specials.eos is not None else np.zeros(n, bool)
    parts = list(docs)
    for i in np.flatnonzero(body < lengths).tolist():
        parts[i] = parts[i][: body[i]]
    flat = np.concatenate(parts, dtype=np.int32, casting="unsafe") if n else np.zeros(0, np.int32)
    if all(d.dtype == np.int32 for d in docs):
        _check_range(flat, body, specials, where)
    kept = body + bos + eos
    if not bos and not eos.any():
        return flat, kept
    starts = np.cumsum(kept) - kept
    out = np.empty(int(kept.sum()), np.int32)
    ids_at = np.ones(len(out), bool)
    if bos:
        out[starts], ids_at[starts] = specials.bos, False
    if eos.any():
        ends = (starts + kept - 1)[eos]
        out[ends], ids_at[ends] = specials.eos, False
    out[ids_at] = flat
    return out, kept


def encode_documents(
    tokenizer: Tokenizer,
    specials: Specials | None,
    items: Sequence[str | np.ndarray],
    *,
    first_doc: int,
    trim_to: int | None,
    where: Callable[[int], str],
    budget: int | None = None,
) -> TokenGroup:
    """One group's tokens: texts tokenized in one call (their memory counted against
    `budget` first: `memory.encode_bounded`), ids through `joined_ids`, in the
    documents' order. `where(i)` names item i's record for messages."""
    text_at = [i for i, x in enumerate(items) if isinstance(x, str)]
    if len(text_at) == len(items):
        return encode_bounded(
            tokenizer, items, first_doc=first_doc, trim_to=trim_to, budget=budget, where=where
        )
    if not text_at:  # all pre-tokenized
        tokens, lengths = joined_ids(items, specials, trim_to=trim_to, where=where)
        return TokenGroup(first_doc=first_doc, tokens=tokens, lengths=lengths)
    pieces: list[np.ndarray] = [np.zeros(0, np.int32)] * len(items)
    # Numbered from the group's first document: an audit's message names where it looked.
    texts = encode_bounded(
        tokenizer,
        [items[i] for i in text_at],
        first_doc=first_doc,
        trim_to=trim_to,
        budget=budget,
        where=lambda j: where(text_at[j]),
    )
    for i, start, n in zip(text_at, texts.starts.tolist(), texts.lengths.tolist(), strict=True):
        pieces[i] = texts.tokens[start : start + n]
    lengths = np.zeros(len(items), np.int64)
    lengths[text_at] = texts.lengths
    for i in (i for i, x in enumerate(items) if not isinstance(x, str)):
        one, n = joined_ids([items[i]], specials, trim_to=trim_to, where=lambda _, i=i: where(i))
        pieces[i], lengths[i] = one, n[0]
    return TokenGroup(
        first_doc=first_doc,
        tokens=np.concatenate(pieces) if pieces else np.zeros(0, np.int32),
        lengths=lengths,
        audited=texts.audited,  # its texts' audit, carried to the stream's figures
        mismatched=texts.mismatched,
        fell_back=texts.fell_back,
        by_backend=texts.by_backend,
    )
