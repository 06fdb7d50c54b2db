"""A document's tokenizing memory, counted before the work: each kind's measured bytes a
character (`BYTES_PER_CHAR`), a document over the budget refused naming it, and the process's
budget for the long documents being tokenized at once (`TOKENIZING`).

A tokenizer library holds tens to hundreds of bytes for each character of a text it tokenizes
whole (sentencepiece's lattice, `tokenizers`' offsets and pre-tokenized splits); a spaceless
64 MiB line, which no cut at a space makes shorter, took a server to 2.4 GB and two at once
killed it. Measured on this project's fixture models over 2-4 M characters of `a`, NUL, CJK,
base64 and prose, peak memory over the text itself, the most of the reference and every fast
backend (docs/benchmarks.md, "Tokenizing memory"): sentencepiece 37-76 (kitoken 95-164),
Hugging Face 140-443 (fastokens 6-72), tiktoken 5-25 (fastokens 6-36) bytes a character.
tekken, which tiktoken tokenizes a whole document at a time, as mistral-common does, takes more
than MaxText's tiktoken pieces (docs/benchmarks.md, the same section).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from input_server.data.tokenizers.groups import TokenGroup, joined
from input_server.errors import OverBudgetError

MIB = 1 << 20
# The most measured for each kind (above), rounded up: an estimate, never an undercount.
BYTES_PER_CHAR = {"sentencepiece": 170, "huggingface": 450, "tiktoken": 40, "tekken": 128}
MOST_BYTES_PER_CHAR = max(BYTES_PER_CHAR.values())
# A call whose documents would take less than this is not counted (a few short documents).
UNCOUNTED_BYTES = 8 * MIB
# Documents longer than this are estimated one by one (`Tokenizer.memory_bytes`: what a cut
# leaves of them); shorter ones at their length, together.
LONG_CHARS = 16_384
# Seconds between looks at the budget while waiting for room (the holder frees it when its
# call returns; a wait is never longer than another call's tokenizing).
WAIT_S = 0.05


class TokenizingBudget:
    """The estimated bytes of the documents this process tokenizes right now, every stream
    together, within a limit (the server's --stream-memory-mb): a call holds its documents'
    estimate while the library works, and waits for room before it."""

    def __init__(self):
        self._room = threading.Condition()
        self._held = 0

    @property
    def held(self) -> int:
        return self._held

    @contextmanager
    def hold(self, n: int, limit: int) -> Iterator[None]:
        """Holds `n` bytes (at most `limit`) while the block runs, once the process's other
        holders leave room for them."""
        with self._room:
            while self._held and self._held + n > limit:
                self._room.wait(WAIT_S)
            self._held += n
        try:
            yield
        finally:
            with self._room:
                self._held -= n
                self._room.notify_all()


TOKENIZING = TokenizingBudget()


def encode_bounded(
    tokenizer,
    texts: Sequence[str],
    *,
    first_doc: int,
    trim_to: int | None,
    budget: int | None,
    where: Callable[[int], str],
) -> TokenGroup:
    """`tokenizer.encode(texts)`, its memory counted first: a document whose estimate is over
    `budget` is refused (RESOURCE_EXHAUSTED naming `where(i)`, its size and the flag); the
    call holds its documents' estimate in `TOKENIZING` while it runs, split into runs that
    each fit the budget. The ids are the same as one call's: each document is tokenized alone
    either way."""
    texts = list(texts)
    lengths = list(map(len, texts))
    if budget is None or sum(lengths) * MOST_BYTES_PER_CHAR <= UNCOUNTED_BYTES:
        return tokenizer.encode(texts, first_doc=first_doc, trim_to=trim_to)
    per_char = tokenizer.memory_bytes("x", None)
    costs = [n * per_char for n in lengths]
    for i in (i for i, n in enumerate(lengths) if n > LONG_CHARS):
        costs[i] = n = tokenizer.memory_bytes(texts[i], trim_to)
        if n > budget:
            raise OverBudgetError(_refusal(tokenizer, texts[i], n, budget, where(i)))
    if sum(costs) <= UNCOUNTED_BYTES:
        return tokenizer.encode(texts, first_doc=first_doc, trim_to=trim_to)
    groups = []
    for lo, hi in _runs(costs, budget):
        with TOKENIZING.hold(sum(costs[lo:hi]), budget):
            groups.append(tokenizer.encode(texts[lo:hi], first_doc=first_doc + lo, trim_to=trim_to))
    return joined(groups)


def _runs(costs: list[int], budget: int) -> Iterator[tuple[int, int]]:
    """Consecutive runs of documents whose costs together fit `budget` (each one does)."""
    lo, total = 0, 0
    for i, n in enumerate(costs):
        if total + n > budget:
            yield lo, i
            lo, total = i, 0
        total += n
    yield lo, len(costs)


def _refusal(tokenizer, text: str, n: int, budget: int, where: str) -> str:
    kind = tokenizer.spec.kind
    return (
        f"{where}: a document of {len(text):,} characters would take ~{n / MIB:,.0f} MiB to "
        f"tokenize ({kind} models hold up to {BYTES_PER_CHAR.get(kind, MOST_BYTES_PER_CHAR)} "
        f"bytes a character of what they tokenize whole), over the server's "
        f"--stream-memory-mb {budget / MIB:g}; split the document (a line with no space is "
        f"tokenized whole), or ask the operator for a larger budget."
    )
