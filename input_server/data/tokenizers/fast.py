"""The fast backends (`backends.Backend`): fastokens for tiktoken ranks and byte-level BPE
`tokenizer.json` files, kitoken for sentencepiece models. Each is loaded lazily in the process
that encodes (not pickled: a tiktoken model's derived tokenizer.json text is, with its
tokenizer) and encodes on the calling thread."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Callable
from importlib import metadata

import numpy as np

from input_server.data.tokenizers.groups import framed
from input_server.errors import InvalidSpecError

# One thread a call: the server's parallelism is Grain's threads and processes, which the
# tuner counts; fastokens would otherwise spread a batch over a pool of its own. An
# operator's own setting stands. Read by fastokens when it starts its pool.
os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")

# Deriving a tokenizer.json from tiktoken ranks looks at every split of every token (in Python,
# the GIL held), and writes a merge for each split of a token into two tokens: both bounded,
# the merges' characters too (Llama 3's ranks: 831,311 bytes of tokens, 1.2 s, 280,147 merges
# of 2.0 M characters, 2.2 merges a token, an 11.5 M-character text; a crafted file of long
# runs made 204 MB from 2.2 MB before the merges were bounded, and 16 MB of random 760-byte
# tokens took 7.4 s before the work was bounded at 5 x Llama 3's).
MAX_DERIVE_WORK = 4 << 20
MAX_MERGES_PER_TOKEN = 8
MAX_MERGE_CHARS = 32 << 20
# The tokens whose last join is searched (`_last_pair`): at most this long, and at most this much
# work in all (the sum of their squared lengths; Llama-3-sized ranks take about 7 M).
MAX_SEARCHED_BYTES = 64
MAX_SEARCH_WORK = 32 << 20
# Derived tokenizer.json texts kept per process, by ranks file identity: at most this many, and
# this many characters in all (the newest always kept).
_DERIVED: collections.OrderedDict[tuple, str] = collections.OrderedDict()
_DERIVED_LOCK = threading.Lock()
MAX_DERIVED = 4
MAX_DERIVED_CHARS = 64 << 20
# What the tokenizer cache (`keep.ModelKeep`) keeps a derived tokenizer.json as; the
# derivation's own version, raised whenever `ranks_as_tokenizer_json` changes what it writes.
DERIVED = "tokenizer.json derived from tiktoken ranks"
DERIVE_FORMAT = 3  # 2: one merge a token where tiktoken's last join is known; 3: "a b" merges
# fastokens holds a tokenizer.json in far more memory than `tokenizers` does: measured on
# synthetic byte-level BPE files (3-35 MB, 100 K-1 M tokens) at 27-101 x the file's bytes, most
# for short tokens (10.5 MB of tokens of 2-4 characters: 1,067 MB; 33.8 MB of 1 M tokens: 2.5
# GB peak, 26 s), where the reference took 10-15 x. A 110 MB file would take ~11 GB: a 3 GB
# server sat at its limit, then died. The estimate errs above the worst seen.
FASTOKENS_BYTES_PER_FILE_BYTE = 128
# A kitoken encoder of a sentencepiece model takes some 20 x the model file's bytes
# (docs/benchmarks.md, "Run 8"); the copies of one model stay within the budget.
KITOKEN_BYTES_PER_FILE_BYTE = 24
KITOKEN_COPIES_BYTES = 256 << 20


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def derived_fields(digest: str, pattern: str) -> dict[str, str]:
    """What a tokenizer.json derived from ranks depends on: the ranks file (its digest), the
    split pattern, the derivation, and the library that loads it."""
    return {
        "digest": digest,
        "pattern": hashlib.sha256(pattern.encode()).hexdigest(),
        "derive_format": str(DERIVE_FORMAT),
        "fastokens": Fastokens.version,
    }


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-to-character map, which byte-level BPE `tokenizer.json` files spell
    tokens in."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _splits(token: bytes, ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every way to cut `token` into two tokens."""
    return [
        (token[:c], token[c:])
        for c in range(1, len(token))
        if token[:c] in ranks and token[c:] in ranks
    ]


def _last_pair(token: bytes, ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The two tokens tiktoken joins last when it merges `token`'s bytes into `token`, or none
    when it never does: its merging of the bytes alone (the lowest-ranked adjacent pair first,
    the leftmost of equals) stopped before the last join.

    Why one pair is enough: wherever tiktoken makes `token` inside a longer piece, no join
    crossed the token's edges before, so its bytes were joined in the order they are alone;
    the parts it joins last are these two, and no other cut of `token` is ever adjacent."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            return []
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return [(parts[0], parts[1])] if len(parts) == 2 else []


def ranks_as_tokenizer_json(ranks: dict[bytes, int], pattern: str, written: str) -> str:
    """A byte-level BPE `tokenizer.json` that tokenizes as tiktoken does with `ranks` and
    `pattern`: each piece whole if it is a token (`ignore_merges`), else merged pair by pair,
    the pair whose join ranks lowest first, as tiktoken merges. A token that no pair of
    tokens makes (Meta's Llama 3 ranks hold some, which fastokens' own tiktoken loader
    refuses) is still whole-piece reachable, as in tiktoken.

    A token gets one merge, the pair tiktoken joins last (`_last_pair`), where it can be cut
    into two tokens in several ways: fastokens' load time grows with the merges (Llama-3-sized
    ranks: 252,142 merges of every cut loaded in 2.1 s, 124,121 in 1.3 s). Past
    MAX_SEARCHED_BYTES or MAX_SEARCH_WORK a token keeps a merge for every cut: as exact (a cut
    tiktoken never makes adjacent never merges), and more to load."""
    work = sum(len(t) for t in ranks)
    if work > MAX_DERIVE_WORK:
        raise InvalidSpecError(
            f"`tokenizer.model` {written!r}: its ranks are too large to derive a fast "
            f"backend from ({work} bytes of tokens, MAX_DERIVE_WORK {MAX_DERIVE_WORK})."
        )
    chars = byte_chars()
    spell = {t: "".join(chars[b] for b in t) for t in ranks}
    merges, most, size, search = [], MAX_MERGES_PER_TOKEN * len(ranks), 0, MAX_SEARCH_WORK
    for token, rank in ranks.items():
        pairs = _splits(token, ranks)
        if len(pairs) > 1 and len(token) <= MAX_SEARCHED_BYTES and search > 0:
            search -= len(token) ** 2
            pairs = _last_pair(token, ranks)
        for a, b in pairs:
            merges.append((rank, ranks[a], ranks[b], spell[a], spell[b]))
            size += len(token)
        if len(merges) > most or size > MAX_MERGE_CHARS:
            raise InvalidSpecError(
                f"`tokenizer.model` {written!r}: its ranks make too many merges to derive a "
                f"fast backend from (past {most} merges or {MAX_MERGE_CHARS} characters: "
                f"MAX_MERGES_PER_TOKEN, MAX_MERGE_CHARS)."
            )
    merges.sort()
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": True,
        "vocab": {spell[t]: r for t, r in ranks.items()},
        # "a b", not ["a", "b"]: fastokens 0.3.5 loads Llama 3's derivation ~20 % faster so
        # (docs/benchmarks.md, "Time to a first batch after a (re)start"), with the same ids.
        # No spelled token holds a space (byte-level spelling writes 0x20 as "Ġ"): the split
        # is unambiguous.
        "merges": [f"{a} {b}" for *_, a, b in merges],
    }
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated"}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    return json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [{**split, "invert": False}, {**byte_level, "trim_offsets": True}],
            },
            "post_processor": None,
            "decoder": {**byte_level, "trim_offsets": True},
            "model": model,
        }
    )


class Fastokens:
    """fastokens on a `tokenizer.json` text: `encode_batch_flat`, one flat buffer a group,
    specials in the text matched as the reference matches them (`tokenizer.json`'s added
    tokens; a derived tiktoken file has none, so its specials stay text)."""

    name = "fastokens"
    version = version_of("fastokens")

    def __init__(self, tok, derived: str | None = None):
        self._tok = tok
        self.derived = derived  # the tokenizer.json derived from tiktoken ranks, if one was

    @classmethod
    def from_json(cls, tokenizer_json: str) -> Fastokens:
        import fastokens

        return cls(fastokens.Tokenizer.from_json_str(tokenizer_json))

    @classmethod
    def from_tiktoken(
        cls, path: str, pattern: str, ranks_of, written: str, derived: str | None = None
    ) -> Fastokens:
        """fastokens' own tiktoken loader, or (for ranks it refuses, as Meta's Llama 3's) a
        tokenizer.json derived from them (`derived`, else `derived_json`); no specials: they
        stay text. The derived text is kept (`derived`): worker processes are handed it
        (deriving Llama 3's took 1.6 s of a process's start)."""
        import fastokens

        if derived is None:
            try:
                return cls(fastokens.Tokenizer.from_tiktoken(path, pattern=pattern))
            except Exception:  # e.g. "token did not decompose into 2 pieces": derived instead
                derived = derived_json(path, ranks_of, pattern, written)
        return cls(fastokens.Tokenizer.from_json_str(derived), derived)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids in one uint32 array, and where each text's start (n + 1 offsets)."""
        ids, offsets = self._tok.encode_batch_flat(texts, add_special_tokens=False)
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """`encode_flat`, `head` and `tail` put around each text's ids (`groups.framed`)."""
        return framed(*self.encode_flat(texts), head, tail)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        flat, offsets = self.encode_flat(texts)
        flat = flat.view(np.int32)
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(texts))]


class EncoderPool:
    """Copies of one encoder, each used by one call at a time: a call takes a spare copy, or
    loads one while fewer than `most` are loaded, or waits for one to come back. As many are
    loaded as calls ran at once (never more than `most`), and they outlive the threads that
    made them (a stream's thread pool is made anew on each retune)."""

    def __init__(self, load: Callable[[], object], most: int):
        self._load = load
        first = load()  # an encoder that cannot load is refused here, at once
        self._spare, self._loaded, self._most = [first], 1, max(1, most)
        self._returned = threading.Condition()

    def loaded(self) -> int:
        with self._returned:
            return self._loaded

    @contextlib.contextmanager
    def copy(self):
        """An encoder no other call uses until this one ends."""
        with self._returned:
            while not self._spare and self._loaded >= self._most:
                self._returned.wait()
            tok = self._spare.pop() if self._spare else None
            if tok is None:
                self._loaded += 1  # counted before it loads: no other call loads past `most`
        if tok is None:
            try:
                tok = self._load()  # outside the lock: other calls take spare copies meanwhile
            except BaseException:
                with self._returned:
                    self._loaded -= 1
                    self._returned.notify()
                raise
        try:
            yield tok
        finally:
            with self._returned:
                self._spare.append(tok)
                self._returned.notify()


class Kitoken:
    """kitoken on a sentencepiece `.model`: `encode_all`, specials in the text encoded as text
    (as sentencepiece encodes them). A kitoken encoder keeps state that every call touches:
    calls sharing one at once contend for it, and its CPU a token grows with them
    (docs/benchmarks.md, "Run 8"). So each call encodes with a copy no other call holds
    (`EncoderPool`), as many as `KITOKEN_COPIES_BYTES` holds, all made from the model's bytes
    as read once (a file replaced meanwhile changes no copy)."""

    name = "kitoken"
    version = version_of("kitoken")

    def __init__(self, path: str):
        import kitoken

        with open(path, "rb") as f:
            data = f.read()
        most = KITOKEN_COPIES_BYTES // max(1, len(data) * KITOKEN_BYTES_PER_FILE_BYTE)
        self._pool = EncoderPool(lambda: kitoken.Kitoken.from_sentencepiece(data), most)

    def copies(self) -> int:
        """The encoders loaded so far: the most calls that ran at once, up to the cap."""
        return self._pool.loaded()

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids in one int32 array, `head` before and `tail` after each text's own,
        and where each text's start (n + 1 offsets). kitoken answers in lists of Python ints:
        they are read once, in one pass over the group (an array a text, then their join and
        the ends put in place, took 1.5-2 x as long a token)."""
        with self._pool.copy() as tok:
            ids = tok.encode_all(texts, False)
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, ids), np.int64, len(ids)), out=offsets[1:])
        if head or tail:
            offsets += np.arange(len(ids) + 1) * (len(head) + len(tail))
            framed: list[list[int]] = []
            for x in ids:
                framed += (head, x, tail)
            ids = framed
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(offsets[-1]))
        return flat, offsets

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        flat, offsets = self.encode_framed(texts, [], [])
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(texts))]


def check_fastokens_fits(
    written: str, size: int, tokens: int, reference_bytes: int, budget: int
) -> None:
    """Refuses, before it loads, a fastokens copy of a `size`-byte tokenizer.json that would
    take the model (the reference's `reference_bytes` and fastokens' estimate) past `budget`,
    the memory the server gives a loaded model: the reference then serves (the backend is
    only faster), and the stream's why names the numbers.

    Raises:
      InvalidSpecError: past the budget (`route` falls back to the reference on it)."""
    need = size * FASTOKENS_BYTES_PER_FILE_BYTE
    if reference_bytes + need <= budget:
        return
    mb = 1 << 20
    largest = size * budget / (reference_bytes + need)
    raise InvalidSpecError(
        f"`tokenizer.model` {written!r} ({size / mb:,.1f} MB, {tokens:,} tokens): fastokens "
        f"would take about {need / mb:,.0f} MB loaded ({FASTOKENS_BYTES_PER_FILE_BYTE} x the "
        f"file, FASTOKENS_BYTES_PER_FILE_BYTE) beside the reference's {reference_bytes / mb:,.0f} "
        f"MB, past the {budget / mb:,.0f} MB the server gives a loaded tokenizer model "
        f"(MAX_LOADED_BYTES); the reference serves it (fastokens takes files of up to about "
        f"{largest / mb:,.1f} MB)"
    )


def derived_json(path: str, ranks_of, pattern: str, written: str) -> str:
    """The tokenizer.json derived from the ranks file at `path` (`ranks_as_tokenizer_json`),
    made once a process for each file as it stands (its identity: device, inode, size, mtime)."""
    st = os.stat(path)
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, pattern)
    with _DERIVED_LOCK:
        hit = _DERIVED.get(key)
    if hit is None:
        hit = ranks_as_tokenizer_json(ranks_of(), pattern, written)
        with _DERIVED_LOCK:
            _DERIVED[key] = hit
            while len(_DERIVED) > 1 and (
                len(_DERIVED) > MAX_DERIVED or sum(map(len, _DERIVED.values())) > MAX_DERIVED_CHARS
            ):
                _DERIVED.popitem(last=False)
    return hit
