"""Fast tokenizer backends behind a kind's reference library, and the gate that lets one serve.

A backend (`Backend`) encodes texts to their bare ids (no BOS/EOS) as the kind's reference
library would: fastokens for tiktoken files and byte-level BPE `tokenizer.json` files, kitoken
for sentencepiece models (`fast.py` makes them). None serves until the gate (`gate`) has
compared its ids with the reference's on a fixed set of hostile probes (`PROBES`) and on the
stream's first documents; any difference, or any error, and the stream uses the reference,
saying why. The gate's verdict on the probes is remembered per model digest, backend and
version (`_PROBED`, and on disk in the tokenizer cache, `keep.ModelKeep`, for later processes
and restarts), the documents are compared for each pipeline. While serving, a share of groups is
audited again (`route.Router.encode`, the share following the stream's spare room:
`serving/audit_pace.py`); what the reference says is what is served.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable
from typing import Protocol

import numpy as np

from input_server.data.tokenizers import fast
from input_server.data.tokenizers.checks import NOT_THE_MODEL
from input_server.data.tokenizers.keep import ModelKeep

# Bare ids of each text, as the kind's reference gives them without BOS/EOS.
Encode = Callable[[list[str]], list[np.ndarray]]


class Backend(Protocol):
    """A library that encodes as a kind's reference does, faster (`fast.py`). Both calls run
    on the calling thread, the GIL released where the library allows, and raise on what the
    library cannot encode (the reference then does)."""

    name: str  # as `tokenizer.backend` names it
    version: str  # the library's, part of what the gate's verdict is remembered by

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's bare ids (int32)."""
        ...

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids in one int32 array, `head` before and
        `tail` after each text's own, and where each text starts (len(texts) + 1 offsets,
        int64): what `route.Router` serves a group from."""
        ...


@dataclasses.dataclass(frozen=True)
class Choice:
    """Who tokenizes a stream, and why (what `info`, the log and `bench` say)."""

    backend: str  # "reference" or a backend's name
    why: str
    # A fast backend loads behind the stream (`Router.load_behind`): this choice serves only
    # until it is chosen or refused.
    pending: bool = False


# What a backend is most likely to get wrong: specials written as text, long runs, line ends,
# digits, emoji and ZWJ sequences, CJK, NFKC bait, combining marks, lone surrogates, nothing.
PROBES: tuple[str, ...] = (
    "",
    " ",
    "Hello, world! It's a test; we'll see what they've done.",
    "<s> [INST] <|begin_of_text|><|end_of_text|><|eot_id|></s> <unk> <pad> <|endoftext|>",
    " " * 25_003 + "x",
    "a" * 25_003 + " b",
    "word " * 3_000,
    "line one\r\nline two\r\n\r\n\tindented\n\t\ttwice\n \n",
    "1234567890 3.14159 -42 1,000,000 0x1F 2026-12-05",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flags 🇯🇵🇫🇷",
    "中文字符测试，日本語のテキスト、한국어 텍스트。",
    "ﬁ ﬂ ① ½ ｆｕｌｌｗｉｄｔｈ Å ℌ ㎏ ﬀ \u00a0nbsp",
    "e\u0301 a\u0308 o\u0303\u0323 ñ Z\u0351\u0358\u035c",
    "lone \ud800 surrogate \udfff here",
    "    def f(x):\n        return x  # comment\n\n\n",
    "MiXeD CaSe ALLCAPS lowercase 'S 'T 'RE 'VE 'M 'LL 'D",
    "\x00\x01\x7f control \u200b zero width \ufeff bom",
    "http://example.com/path?q=1&r=2#frag user@example.org",
    "Ünïcödé ÀÉÎÕÜ ßẞ İı Ωω Ǆǅǆ",
    # Runs of one punctuation mark, alone and after newlines: where a unigram model's
    # segmentations tie (`>>`,`>` or `>`,`>>`), kitoken broke ties unlike sentencepiece on
    # all 11 unigram models tried (scripts/bench/bench_unigram_peer.py's notes, docs/benchmarks.md).
    " ".join("w" + c * n for c in "*->=~#." for n in range(3, 34, 5)),
    "\n".join(c * n for c in "*-=#" for n in (3, 8, 13, 21)),
)

# The probe verdicts, by (model digest, backend, version): a stream of a model already
# probed compares only its own documents. Bounded: a server sees few models.
_PROBED: collections.OrderedDict[tuple, str | None] = collections.OrderedDict()
_PROBED_LOCK = threading.Lock()
MAX_PROBED = 256


def _keep(e: BaseException) -> None:
    """Raises `e` again if the interpreter must keep it (a stop asked for, memory)."""
    if isinstance(e, NOT_THE_MODEL):
        raise e


def difference(reference: Encode, fast: Encode, name: str, texts: list[str]) -> str | None:
    """None when `fast` gives every text the reference's ids, or refuses what the reference
    refuses; else the first difference, said without the text (a document's content stays out
    of logs). A batch the reference refuses is compared text by text: one refused document
    must not hide the others."""
    try:
        want = reference(texts)
    except BaseException as e:  # noqa: BLE001 - Rust panics are BaseException
        _keep(e)
        if len(texts) > 1:
            return next(
                (w for i, t in enumerate(texts) if (w := difference(reference, fast, name, [t]))),
                None,
            )
        try:
            fast(texts)
        except BaseException as e:  # noqa: BLE001 - both refuse it (sentencepiece's lone
            _keep(e)  # surrogates): a stream holding it fails with the reference's error
            return None
        return f"the reference refused a text ({len(texts[0])} characters) that {name} encoded"
    try:
        got = fast(texts)
    except BaseException as e:  # noqa: BLE001 - a backend's failure or panic is a difference
        _keep(e)
        return f"{name} failed: {type(e).__name__}: {str(e)[:200]}"
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        if len(a) != len(b) or not np.array_equal(a, b):
            n = min(len(a), len(b))
            at = int(np.argmax(a[:n] != b[:n])) if n and not np.array_equal(a[:n], b[:n]) else n
            return (
                f"text {i} of {len(texts)} ({len(texts[i])} characters) differs at token {at} "
                f"({len(a)} reference tokens, {len(b)} from {name})"
            )
    return None


def gate(
    digest: str,
    reference: Encode,
    fast: Encode,
    backend: Backend,
    documents: list[str],
    *,
    keep: ModelKeep | None = None,
    reference_version: str = "",
) -> Choice:
    """Whether `backend` may serve: the probes (their verdict remembered in this process and
    in `keep`, by model digest and the versions of both libraries) and `documents`, encoded by
    the reference and by `fast` (the kind's route through `backend`) and compared id for id.
    Each probe is its own call: a text the backend cannot take (lone surrogates) sends only its
    own group to the reference while serving, so it must not hide the other probes."""
    key = (digest, backend.name, backend.version)
    with _PROBED_LOCK:
        known = key in _PROBED
        why = _PROBED.get(key)
    kept = False
    if not known:
        fields = verdict_fields(digest, backend, reference_version)
        found = _kept_verdict(keep, fields)
        kept = found is not None
        if kept:
            why = found[0]
        else:
            why = next(
                (w for p in PROBES if (w := difference(reference, fast, backend.name, [p]))), None
            )
            why = None if why is None else f"the probe set: {why}"
            if keep is not None:
                keep.put(VERDICT, fields, json.dumps({"why": why}).encode())
        _remember(key, why)
    if why is None and documents:
        why = difference(reference, fast, backend.name, documents)
        why = None if why is None else f"the stream's first documents: {why}"
    if why is not None:
        return Choice("reference", f"{backend.name} {backend.version} failed the gate on {why}")
    return Choice(
        backend.name,
        f"{backend.name} {backend.version} gave the reference's ids on {len(PROBES)} probes"
        f"{' (their verdict read from the tokenizer cache)' if kept else ''} "
        f"and the stream's first {len(documents)} documents",
    )


# What the tokenizer cache keeps the probes' verdict as, and what decides it.
VERDICT = "gate verdict on the probes"
_PROBES_DIGEST = hashlib.sha256("\0".join(PROBES).encode("utf-8", "surrogatepass")).hexdigest()


def verdict_fields(digest: str, backend: Backend, reference_version: str) -> dict[str, str]:
    """What the probes' verdict on a model depends on: the model, both libraries, the probes,
    and the derivation of a tokenizer.json from tiktoken ranks (a new one must pass the probes
    again: the server's own version does not change with it)."""
    return {
        "digest": digest,
        "backend": backend.name,
        "backend_version": backend.version,
        "reference_version": reference_version,
        "probes": _PROBES_DIGEST,
        "derive_format": str(fast.DERIVE_FORMAT),
    }


def _kept_verdict(keep: ModelKeep | None, fields: dict[str, str]) -> tuple[str | None] | None:
    """(why,) as kept (why None: it passed), or None when nothing valid is kept."""
    payload = None if keep is None else keep.get(VERDICT, fields)
    if payload is None:
        return None
    try:
        why = json.loads(payload)["why"]
    except (ValueError, KeyError, TypeError):
        return None
    return (why,) if why is None or isinstance(why, str) else None


def _remember(key: tuple, why: str | None) -> None:
    with _PROBED_LOCK:
        _PROBED[key] = why
        _PROBED.move_to_end(key)  # the newest: evicted last
        while len(_PROBED) > MAX_PROBED:
            _PROBED.popitem(last=False)


def forget(
    digest: str,
    backend: Backend,
    why: str,
    *,
    keep: ModelKeep | None = None,
    reference_version: str = "",
) -> None:
    """An audit found `backend` wrong for the model: later streams of it skip the backend, in
    this process and (through `keep`) in later ones."""
    _remember((digest, backend.name, backend.version), why)
    if keep is not None:
        fields = verdict_fields(digest, backend, reference_version)
        keep.put(VERDICT, fields, json.dumps({"why": why}).encode())
