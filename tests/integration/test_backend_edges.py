"""The fast backends at their edges: tiktoken ranks fastokens' own loader refuses (served through
a derived tokenizer.json, which pickles with the tokenizer), ranks whose derivation is too big,
a backend that panics or will not load, a wrong backend in worker processes (the stage
restarted with the reference), and the token cache, which keeps only the reference's ids."""

from __future__ import annotations

import base64
import collections
import os
import pathlib
import pickle
import threading
import time
import uuid
from typing import ClassVar

import numpy as np
import pytest

from input_client import PipelineSpec
from input_client.spec import TokenizerSpec
from input_server.batching import pipeline as pipeline_module
from input_server.batching.batch_stream import BatchStream
from input_server.batching.encode import CachedIds
from input_server.batching.meter import LiveMeter
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline
from input_server.batching.resume import Position
from input_server.data.builtin_corpora import pydoc_topics, stdlib_docstrings, write_jsonl
from input_server.data.token_cache import TokenCache
from input_server.data.tokenizers import KINDS, fast, load_tokenizer, route
from input_server.data.tokenizers.base import GATE_DOCS
from input_server.data.tokenizers.groups import framed
from input_server.data.tokenizers.tiktoken import PATTERN, TiktokenTokenizer
from input_server.data.tokenizers.trainers import write_tiktoken_model
from tests.support import assert_same_batches, run_pipeline, same_batches
from tests.support.backends import first_new_word

GROUP = 250  # documents a group, in the tests that encode groups themselves
TRIM = 64
# A token no two tokens make: tiktoken reaches it only as a whole piece.
UNREACHABLE = b"\x01\x02\x03"
UNREACHABLE_TEXTS = [
    "\x01\x02\x03",
    "a\x01\x02\x03b",
    " \x01\x02\x03",
    "x \x01\x02\x03\x01\x02\x03 y\n",
    "\x01\x02 and \x02\x03, \x01\x02\x03\r\n",
]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Real text: short docstrings, then pydoc's long topics."""
    return stdlib_docstrings(3000) + pydoc_topics()


@pytest.fixture(scope="module")
def model(texts, tmp_path_factory) -> str:
    """A tiktoken ranks file that fastokens' own loader takes."""
    d = tmp_path_factory.mktemp("edges")
    return write_tiktoken_model(texts[:600], d / "m.tiktoken", vocab_size=800)


@pytest.fixture(scope="module")
def corpus_file(texts, tmp_path_factory) -> str:
    """The docstrings alone (short documents, many groups), for the pipelines."""
    return write_jsonl(texts[:3000], tmp_path_factory.mktemp("edges-data") / "docs.jsonl")


def _append_rank(source: str, path, token: bytes) -> str:
    """`source`'s ranks with `token` after them, written to `path`."""
    lines = pathlib.Path(source).read_text(encoding="ascii").splitlines()
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join([*lines, f"{base64.b64encode(token).decode()} {len(lines)}"]) + "\n")
    return os.fspath(path)


def _spec(corpus_file: str, model: str, backend: str = "fastokens", **tokenizer) -> PipelineSpec:
    return PipelineSpec(
        source={"paths": [corpus_file]},
        tokenizer={"model": model, "kind": "tiktoken", "backend": backend, **tokenizer},
        batch={"seq_len": 256, "size": 8},
        order={"shuffle": False, "epochs": 1},
        workers={"count": 0},
    )


def _reference(model: str, **flags) -> TiktokenTokenizer:
    return load_tokenizer(TokenizerSpec(model=model, kind="tiktoken", backend="reference", **flags))


def _assert_same_group(got, want, what: str) -> None:
    assert got.first_doc == want.first_doc, what
    assert got.same_ids(want), f"{what}: the ids differ from the reference's"


def _never(*args, **kwargs):
    raise AssertionError("the reference tokenized a group the backend should have")


class _Panic(BaseException):
    """As pyo3's PanicException (a Rust panic): a BaseException, not an Exception."""


class _OnWord:
    """fastokens, except on a group holding `word`: "skew" adds one to the first id of each
    text holding it, "panic" raises `_Panic`. Module-level: worker processes unpickle it."""

    name = "fastokens"

    def __init__(self, real, how: str, word: str, version: str):
        self.real, self.how, self.word, self.version = real, how, word, version
        self.derived = real.derived  # what a tiktoken tokenizer pickles for its workers

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.how == "panic" and any(self.word in t for t in texts):
            raise _Panic("called `Option::unwrap()` on a `None` value")
        flat, offsets = self.real.encode_flat(texts)
        if self.how == "skew":
            flat = flat.copy()
            for i, text in enumerate(texts):
                if self.word in text and offsets[i + 1] > offsets[i]:
                    flat[offsets[i]] += 1
        return flat, offsets

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        return framed(*self.encode_flat(texts), head, tail)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        flat, offsets = self.encode_framed(texts, [], [])
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(texts))]


class _OnWordKind(TiktokenTokenizer):
    """tiktoken whose fastokens is `_OnWord` with the class's `on_word` (how, word, version),
    kept by each instance: it pickles to worker processes, where the class's does not."""

    on_word: ClassVar[tuple[str, str, str] | None] = None

    def __init__(self, spec, **kwargs):
        self.on_word_args = type(self).on_word
        super().__init__(spec, **kwargs)

    def load_backend(self, name):
        return _OnWord(super().load_backend(name), *self.on_word_args)


class _LoadsOnce(TiktokenTokenizer):
    """tiktoken whose fastokens loads once: a second load (a fresh process's) raises
    `load_error`. The count pickles with the tokenizer."""

    load_error: BaseException = RuntimeError("no fastokens in this process")
    loads = 0

    def load_backend(self, name):
        self.loads += 1
        if self.loads > 1:
            raise self.load_error
        return super().load_backend(name)


@pytest.fixture
def fresh_backends(monkeypatch):
    """No backend loaded in this process (`route._BACKENDS`, keyed by the tokenizer's class):
    a stand-in kind loads its own, as configured by the test, not an earlier test's."""
    monkeypatch.setattr(route, "_BACKENDS", collections.OrderedDict())


def _version() -> str:
    """A version of its own per test: the gate remembers verdicts by version."""
    return f"test-{uuid.uuid4().hex}"


# -- tiktoken ranks fastokens' own loader refuses ----------------------------------------------


def test_unreachable_ranks_are_served_through_the_derived_json(texts, model, tmp_path, monkeypatch):
    """A token no two tokens make: fastokens' loader refuses the ranks, the derived
    tokenizer.json serves them exactly (the token reached as a whole piece, as tiktoken does),
    and a pickled copy loads from the derived text it carries, deriving nothing."""
    import fastokens

    lines = pathlib.Path(model).read_text(encoding="ascii").splitlines()
    assert f"{base64.b64encode(UNREACHABLE).decode()} " not in "\n".join(lines)
    path = _append_rank(model, tmp_path / "unreachable.tiktoken", UNREACHABLE)
    with pytest.raises(ValueError):  # "tiktoken token did not decompose into 2 pieces"
        fastokens.Tokenizer.from_tiktoken(path, pattern=PATTERN)

    # No audit (its pickled copy's neither): it would serve the reference's group, hiding the
    # backend's.
    tok = load_tokenizer(
        TokenizerSpec(model=path, kind="tiktoken", backend="fastokens"), audit_every=0
    )
    ref = _reference(path)
    bare = ref._encode(["\x01\x02\x03"], add_bos=False, add_eos=False)[0].tolist()
    assert bare == [len(lines)]  # the appended rank, one token: the texts below reach it
    choice = tok.choose_backend(texts[:GATE_DOCS])
    assert choice.backend == "fastokens", choice.why
    assert tok.router.backend.derived is not None

    docs = texts + UNREACHABLE_TEXTS

    def assert_serves_the_reference(tokenizer, what):
        tokenizer.router.reference_group = _never
        for i in range(0, len(docs), GROUP):
            got = tokenizer.encode(docs[i : i + GROUP], i)
            _assert_same_group(got, ref.encode(docs[i : i + GROUP], i), f"{what}, group at {i}")
        assert tokenizer.choice.backend == "fastokens", tokenizer.choice.why

    assert_serves_the_reference(tok, "derived")

    blob = pickle.dumps(tok)
    assert len(blob) > len(tok.router.backend.derived)  # the derived text rides along
    # As a worker process starts: no backend loaded, nothing derived, and deriving would fail.
    monkeypatch.setattr(route, "_BACKENDS", collections.OrderedDict())
    monkeypatch.setattr(fast, "_DERIVED", collections.OrderedDict())

    def no_deriving(*args, **kwargs):
        raise AssertionError("a copy derived the tokenizer.json again")

    monkeypatch.setattr(fast, "ranks_as_tokenizer_json", no_deriving)
    copy = pickle.loads(blob)
    assert copy.router.backend is None
    assert_serves_the_reference(copy, "unpickled")
    assert copy.router.backend.derived == tok.router.backend.derived


def test_ranks_with_too_many_merges_are_refused_quickly(texts, tmp_path):
    """Runs of one byte make a merge for every split of every run (quadratic): past
    MAX_MERGES_PER_TOKEN merges a rank the derivation stops, and the reference serves."""
    runs = 300
    tokens = [bytes([b]) for b in range(256)] + [b"a" * k for k in range(2, runs + 1)]
    tokens.append(UNREACHABLE)  # fastokens' own loader refuses: the derived route is taken
    path = tmp_path / "runs.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)))
    splits = sum(k - 1 for k in range(2, runs + 1))
    assert splits > fast.MAX_MERGES_PER_TOKEN * len(tokens)  # the bound is what is crossed
    assert splits * runs < fast.MAX_MERGE_CHARS  # and not the characters'

    tok = load_tokenizer(TokenizerSpec(model=os.fspath(path), kind="tiktoken"))
    started = time.perf_counter()
    choice = tok.choose_backend(texts[:GATE_DOCS])
    took = time.perf_counter() - started
    assert choice.backend == "reference", choice.why
    assert choice.why.startswith("fastokens could not load the model (InvalidSpecError:")
    assert "too many merges" in choice.why and "MAX_MERGES_PER_TOKEN" in choice.why
    assert took < 10, took
    assert tok.router.serving_backend() is None
    got = tok.encode(texts[:GROUP], 0, TRIM)
    _assert_same_group(got, _reference(os.fspath(path)).encode(texts[:GROUP], 0, TRIM), "runs")


# -- a backend that panics, or will not load ---------------------------------------------------


def test_a_backend_panic_sends_its_group_to_the_reference(
    texts, model, corpus_file, monkeypatch, fresh_backends, caplog
):
    """A panic (a BaseException that is no Exception) on some groups: those groups get the
    reference's ids, the others the backend's, the stream goes on, the backend still serves."""
    docs = texts[:3000]
    word, _ = first_new_word(docs, GATE_DOCS)
    monkeypatch.setattr(_OnWordKind, "on_word", ("panic", word, _version()))
    spec = TokenizerSpec(model=model, kind="tiktoken", backend="fastokens")  # no trial
    tok = _OnWordKind(spec, audit_every=0)
    ref = _reference(model)
    assert tok.choose_backend(docs[:GATE_DOCS]).backend == "fastokens"
    panicked = 0
    for i in range(0, len(docs), GROUP):
        group = docs[i : i + GROUP]
        failed = any(word in t for t in group)
        panicked += failed
        got = tok.encode(group, i, TRIM)
        _assert_same_group(got, ref.encode(group, i, TRIM), f"group {i}")
        assert got.fell_back == failed, i  # marked, for the stream to count
    assert panicked > 0
    assert tok.router.failed_groups == panicked
    assert tok.choice.backend == "fastokens"
    assert sum("failed on the group" in r.getMessage() for r in caplog.records) == 1  # the first

    # In a pipeline's stream.
    spec = _spec(corpus_file, model)
    want = run_pipeline(spec.replace(tokenizer={"backend": "reference"}), threads=1)
    monkeypatch.setitem(KINDS, "tiktoken", _OnWordKind)
    pipeline = Pipeline(spec)
    assert pipeline.tokenizer.choice.backend == "fastokens"
    meter = LiveMeter()  # what the stream's info, metrics and `info` line read
    with pipeline.stream(None, parallelism=Parallelism(0, 2), meter=meter) as stream:
        got = list(stream)
    assert_same_batches(got, want)
    assert pipeline.tokenizer.router.failed_groups == meter.backend_failures() > 0
    assert pipeline.tokenizer.choice.backend == "fastokens"


def test_a_load_holds_up_no_model_already_loaded(
    texts, model, tmp_path, monkeypatch, fresh_backends
):
    """One model's backend loading (Llama 3's takes seconds; a crafted one longer) keeps no
    other stream from a model already loaded; a second load of the same model waits for the
    first and shares it."""
    loaded = TiktokenTokenizer(TokenizerSpec(model=model, kind="tiktoken"))
    fast_loaded = loaded.router.loaded_backend("fastokens")
    other_path = write_tiktoken_model(texts[600:900], tmp_path / "o.tiktoken", vocab_size=700)
    other = TiktokenTokenizer(TokenizerSpec(model=other_path, kind="tiktoken"))
    started, release = threading.Event(), threading.Event()
    real, loads = TiktokenTokenizer.load_backend, []

    def slow(self, name):
        if self.digest() == other.digest():
            loads.append(name)
            started.set()
            assert release.wait(60)
        return real(self, name)

    monkeypatch.setattr(TiktokenTokenizer, "load_backend", slow)
    got = []
    threads = [
        threading.Thread(target=lambda: got.append(other.router.loaded_backend("fastokens")))
    ]
    threads[0].start()
    assert started.wait(60)
    threads.append(
        threading.Thread(target=lambda: got.append(other.router.loaded_backend("fastokens")))
    )
    threads[1].start()
    t0 = time.monotonic()
    assert loaded.router.loaded_backend("fastokens") is fast_loaded
    assert time.monotonic() - t0 < 1  # not behind the other model's load
    release.set()
    for t in threads:
        t.join(60)
    assert loads == ["fastokens"] and len(got) == 2 and got[0] is got[1]


def test_a_backend_panic_in_the_gate_leaves_the_reference(
    texts, model, monkeypatch, fresh_backends
):
    """A panic on one of the gate's documents is the backend failing the gate, said, not an
    error that fails the stream."""
    docs = texts[:GATE_DOCS]
    word, _ = first_new_word(texts, 0)
    monkeypatch.setattr(_OnWordKind, "on_word", ("panic", word, _version()))
    tok = _OnWordKind(TokenizerSpec(model=model, kind="tiktoken"))
    choice = tok.choose_backend([*docs, f"a text with {word} in it"])
    assert choice.backend == "reference"
    assert "failed the gate" in choice.why and "_Panic" in choice.why, choice.why


@pytest.mark.parametrize(
    "error",
    [RuntimeError("no fastokens in this process"), _Panic("fastokens panicked while loading")],
    ids=["exception", "panic"],
)
def test_a_backend_that_will_not_load_in_a_fresh_process_falls_back(
    texts, model, monkeypatch, fresh_backends, error
):
    """The gate chose fastokens in one process; a copy of the tokenizer in a fresh process
    (pickled, no backend loaded) cannot load it, by an exception or a panic: its groups get
    the reference's ids, and it says why, rather than failing the stream."""
    monkeypatch.setattr(_LoadsOnce, "load_error", error)
    tok = _LoadsOnce(TokenizerSpec(model=model, kind="tiktoken"))
    assert tok.choose_backend(texts[:GATE_DOCS]).backend == "fastokens"
    monkeypatch.setattr(route, "_BACKENDS", collections.OrderedDict())  # a fresh process's
    copy = pickle.loads(pickle.dumps(tok))
    assert copy.choice.backend == "fastokens"  # as the gate chose, in the process that gated
    got = copy.encode(texts[:GROUP], 0, TRIM)
    _assert_same_group(got, _reference(model).encode(texts[:GROUP], 0, TRIM), "fresh process")
    assert copy.choice.backend == "reference"
    assert copy.choice.why == f"fastokens would not load ({type(error).__name__}: {error})"
    assert copy.loads == 2


# -- a wrong backend in worker processes -----------------------------------------------------


def test_a_mismatch_in_a_worker_restarts_the_stage_with_the_reference(
    texts, model, corpus_file, monkeypatch, fresh_backends
):
    """A backend wrong on a word first found after the first groups, run in two worker
    processes with every group audited: the worker that finds it serves the reference's group
    and falls back, but the other may still run the backend; so the stream is marked stale and
    its stage restarted once, at the same parallelism, with the reference (whose groups are
    not audited), and every batch is the reference's."""
    monkeypatch.setattr(pipeline_module, "GROUP_CHARS", 32 << 10)  # many groups, some in flight
    docs = texts[:3000]  # corpus_file's
    spec = _spec(corpus_file, model)
    reference = Pipeline(spec.replace(tokenizer={"backend": "reference"}))
    want = run_pipeline(reference, threads=1)
    size = reference.group_size
    word, at = first_new_word(docs, 3 * size)
    assert at + 4 * size < len(docs)  # groups after it, for the restart to serve
    monkeypatch.setattr(_OnWordKind, "on_word", ("skew", word, _version()))
    monkeypatch.setitem(KINDS, "tiktoken", _OnWordKind)
    pipeline = Pipeline(spec, audit_every=1)
    assert pipeline.group_size == size
    assert pipeline.tokenizer.choice.backend == "fastokens", pipeline.tokenizer.choice.why

    meter = LiveMeter()
    got, restarted_at, audits_before = [], None, None
    with BatchStream(pipeline, Position(), Parallelism(2, 1), meter=meter) as stream:
        for produced in stream:
            if restarted_at is None and stream.switches:
                restarted_at = produced.seq
            elif restarted_at is None:
                audits_before = meter.audits()  # the old stage's, after each of its batches
            got.append(produced)
        assert stream.switches == 1 and stream.parallelism == Parallelism(2, 1)
    assert restarted_at is not None and audits_before is not None
    assert pipeline.tokenizer.choice.backend == "reference"
    assert "an audit found" in pipeline.tokenizer.choice.why
    made, audited, mismatches = audits_before
    assert mismatches >= 1 and audited > at // size and made >= audited
    assert meter.audits() == audits_before  # the restarted stage's groups: the reference's

    assert len(got) == len(want)
    after = [p.seq for p in got[restarted_at:] if not same_batches([p], [want[p.seq]])]
    assert after == [], f"batches {after} after the restart (at {restarted_at}) differ"
    # Every group audited: even the stale worker's wrong groups were served as the
    # reference's, so the window before the restart is empty too.
    before = [p.seq for p in got[:restarted_at] if not same_batches([p], [want[p.seq]])]
    assert before == [], f"batches {before} before the restart (at {restarted_at}) differ"


# -- the token cache ---------------------------------------------------------------------------


def test_the_token_cache_keeps_only_the_references_ids(texts, model, tmp_path):
    """A pipeline served by fastokens neither reads nor fills the cache; the reference's does,
    under a namespace that changes with the flags and with the data file's bytes."""
    data = write_jsonl(texts[:200], tmp_path / "few.jsonl")
    cache = TokenCache(os.fspath(tmp_path / "cache"), 16 << 20)
    spec = _spec(data, model)
    auto = Pipeline(spec, token_cache=cache)
    assert auto.tokenizer.choice.backend == "fastokens" and auto.cached is None
    assert auto.cache_use == "not used: fastokens tokenizes"  # what its stream_open log says
    run_pipeline(auto, threads=1)
    assert cache.stats()["entries"] == 0

    reference = spec.replace(tokenizer={"backend": "reference"})
    pipeline = Pipeline(reference, token_cache=cache)
    assert isinstance(pipeline.cached, CachedIds) and pipeline.cached.cache is cache
    assert pipeline.cache_use == "used"
    run_pipeline(pipeline, threads=1)
    assert cache.stats()["entries"] == 200

    namespace = pipeline.cached.namespace
    assert Pipeline(reference, token_cache=cache).cached.namespace == namespace
    no_eos = Pipeline(reference.replace(tokenizer={"add_eos": False}), token_cache=cache)
    assert no_eos.cached.namespace != namespace
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    # Keyed on the bytes (issue 39): a new modification time alone keeps the namespace, new
    # text does not.
    assert Pipeline(reference, token_cache=cache).cached.namespace == namespace
    write_jsonl(texts[200:400], data)
    changed = Pipeline(reference, token_cache=cache).cached.namespace
    assert changed not in (namespace, no_eos.cached.namespace)
    cache.close()
