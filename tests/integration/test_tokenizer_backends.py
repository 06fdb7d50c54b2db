"""Fast tokenizer backends: on each kind's model the gate lets its backend serve, and every
document of real text and every probe gets the reference's group from it; a backend wrong from
the start is stopped by the gate, one wrong later by the audit (the reference's ids served, the
model remembered); `tokenizer.backend` is checked, round-trips and is not part of the data; a
server's stream says who tokenized it and how many groups were audited."""

from __future__ import annotations

import collections
import os
import threading
import time

import grpc
import kitoken as kitoken_library
import numpy as np
import pytest

from input_client import InputClient, PipelineSpec, StreamError
from input_client.spec import SpecError, TokenizerSpec
from input_server.batching.meter import LiveMeter
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline
from input_server.data.builtin_corpora import pydoc_topics, stdlib_docstrings, write_jsonl
from input_server.data.tokenizers import KINDS, backends, fast, load_tokenizer, route
from input_server.data.tokenizers.backends import PROBES
from input_server.data.tokenizers.base import GATE_DOCS
from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer
from input_server.data.tokenizers.trainers import (
    train_hf_tokenizer,
    train_sentencepiece,
    write_tiktoken_model,
)
from input_server.errors import InvalidSpecError
from tests.support import assert_same_batches, run_pipeline, stream_status
from tests.support.backends import first_new_word, own_version, skewed_kind

# Which backend serves which kind's fixture model.
BACKEND = {"tiktoken": "fastokens", "huggingface": "fastokens", "sentencepiece": "kitoken"}
GROUP = 250  # documents a group, in the tests that encode groups themselves
TRIM = 64


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Real text: short docstrings, then pydoc's long topics (a few thousand documents)."""
    return stdlib_docstrings(3000) + pydoc_topics()


@pytest.fixture(scope="module")
def models(texts, tmp_path_factory) -> dict[str, str]:
    """One model per kind that its backend serves, and a sentencepiece model kitoken cannot."""
    d = tmp_path_factory.mktemp("backends")
    train = texts[:600]
    return {
        "tiktoken": write_tiktoken_model(train, d / "m.tiktoken", vocab_size=800),
        "huggingface": train_hf_tokenizer(train, d / "hf", vocab_size=800),
        # As Llama's and Gemma's models are made: kitoken is exact on these.
        "sentencepiece": train_sentencepiece(
            train,
            d / "bpe",
            vocab_size=1000,
            model_type="bpe",
            normalization="identity",
            keep_whitespace=True,
            byte_fallback=True,
        ),
        # sentencepiece's default NFKC normalization, which kitoken does not reproduce.
        "nfkc": train_sentencepiece(train, d / "nfkc", vocab_size=1000, model_type="bpe"),
    }


@pytest.fixture(scope="module")
def corpus_file(texts, tmp_path_factory) -> str:
    return write_jsonl(texts, tmp_path_factory.mktemp("backend-data") / "texts.jsonl")


def _tokenizer(
    models, kind: str, backend: str | None = None, audit_every: int = route.AUDIT_EVERY, **flags
):
    """The kind's tokenizer; its backend named (default the kind's, `BACKEND`): "auto" would
    put it on trial against the reference over the first groups (`speed.Trial`)."""
    model_kind = "sentencepiece" if kind == "nfkc" else kind
    backend = backend or BACKEND.get(model_kind, "auto")
    return load_tokenizer(
        TokenizerSpec(model=models[kind], kind=model_kind, backend=backend, **flags),
        audit_every=audit_every,
    )


def _spec(corpus_file: str, model: str, backend: str = "fastokens", **workers) -> PipelineSpec:
    return PipelineSpec(
        source={"paths": [corpus_file]},
        tokenizer={"model": model, "kind": "tiktoken", "backend": backend},
        batch={"seq_len": 256, "size": 8},
        order={"shuffle": False, "epochs": 1},
        workers={"count": 0, **workers},
    )


def _documents(group) -> list[list[int]]:
    ends = np.cumsum(group.lengths).tolist()
    return [
        group.tokens[e - n : e].tolist() for e, n in zip(ends, group.lengths.tolist(), strict=True)
    ]


def _assert_same_group(got, want, what) -> None:
    assert got.first_doc == want.first_doc, what
    assert got.tokens.dtype == np.int32 and got.lengths.dtype == np.int64, what
    if not got.same_ids(want):
        a, b = _documents(got), _documents(want)
        doc = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        raise AssertionError(f"{what}: document {got.first_doc + doc} differs from the reference")


def _never(*args, **kwargs):
    raise AssertionError("the reference tokenized a group the backend should have")


# -- each kind's backend, exact on its model -----------------------------------------------------


@pytest.mark.parametrize("kind", list(BACKEND))
@pytest.mark.parametrize("ends", [True, False], ids=["bos-eos", "bare"])
def test_each_kinds_backend_gives_the_references_groups(texts, models, kind, ends):
    # No audit: it would serve the reference's group, hiding the backend's.
    fast = _tokenizer(models, kind, audit_every=0, add_bos=ends, add_eos=ends)
    ref = _tokenizer(models, kind, backend="reference", add_bos=ends, add_eos=ends)
    choice = fast.choose_backend(texts[:GATE_DOCS])
    assert choice.backend == BACKEND[kind], choice.why
    assert f"{BACKEND[kind]} " in choice.why and f"{len(PROBES)} probes" in choice.why
    assert ref.choose_backend(texts[:GATE_DOCS]).backend == "reference"
    info = ref.info()

    fast.router.reference_group = _never  # nor may a group the backend fails on go there
    for trim_to in (None, TRIM):
        for i in range(0, len(texts), GROUP):
            got = fast.encode(texts[i : i + GROUP], i, trim_to)
            want = ref.encode(texts[i : i + GROUP], i, trim_to)
            _assert_same_group(got, want, f"{kind}, trim_to {trim_to}, group at {i}")
            assert not got.audited
        if trim_to is not None:  # the long topics were trimmed
            assert got.lengths.max() == TRIM
    assert (got.tokens[0] == info.bos_id) == ends
    # One document of all the topics: longer than the 400,000 characters MaxText hands tiktoken
    # at a time.
    long = ["\n\n".join(texts[3000:]), "and a short one"]
    assert len(long[0]) > 400_000
    for trim_to in (None, TRIM):
        got, want = fast.encode(long, 9, trim_to), ref.encode(long, 9, trim_to)
        _assert_same_group(got, want, f"{kind}, one long document, trim_to {trim_to}")
    # Documents MaxText cuts (long, or with a run of 25,000+ spaces or non-spaces) among short
    # ones, first, between and last: each text's ids in its own place.
    runs = [" " * 30_000 + "spaces", "x" * 30_000, texts[5] + "\t" * 26_000 + texts[6]]
    mixed = [runs[0], texts[0], long[0], texts[1], runs[1], texts[2], runs[2]]
    got, want = fast.encode(mixed, 3, None), ref.encode(mixed, 3, None)
    _assert_same_group(got, want, f"{kind}, cut documents among short ones")
    assert fast.choice.backend == BACKEND[kind]  # it served throughout

    del fast.router.reference_group  # a probe the backend cannot take (lone surrogates) goes there
    for trim_to in (None, TRIM):
        for n, probe in enumerate(PROBES):
            what = f"{kind}, probe {n}, trim_to {trim_to}"
            try:
                want = ref.encode([probe], 7, trim_to)
            except InvalidSpecError:  # the reference's refusal, the stream's error either way
                with pytest.raises(InvalidSpecError):
                    fast.encode([probe], 7, trim_to)
                continue
            _assert_same_group(fast.encode([probe], 7, trim_to), want, what)
    assert fast.choice.backend == BACKEND[kind]


def test_kitoken_reads_a_groups_ids_once_with_bos_and_eos_in_place(texts, models, monkeypatch):
    """kitoken answers in lists of Python ints: `encode_framed` reads them in one pass, BOS and
    EOS put in place as it reads (no array a document), and serving goes through it."""
    tok = _tokenizer(models, "sentencepiece", audit_every=0, add_bos=True, add_eos=True)
    assert tok.choose_backend(texts[:GATE_DOCS]).backend == "kitoken"
    kitoken = tok.router.serving_backend()
    group = [*texts[:40], "", " ", texts[-1]]
    lists = kitoken_library.Kitoken.from_sentencepiece_file(models["sentencepiece"]).encode_all(
        group, False
    )
    for head, tail in (([], []), ([1], [2]), ([5, 6], []), ([], [7])):
        flat, offsets = kitoken.encode_framed(group, head, tail)
        assert flat.dtype == np.int32 and offsets.tolist()[0] == 0
        got = [flat[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        assert got == [[*head, *x, *tail] for x in lists], (head, tail)
    assert [x.tolist() for x in kitoken.encode(group)] == lists
    assert kitoken.encode_framed([], [1], [2])[1].tolist() == [0]

    framed = []
    real = kitoken.encode_framed
    monkeypatch.setattr(kitoken, "encode_framed", lambda *a: framed.append(a) or real(*a))
    want = _tokenizer(models, "sentencepiece", backend="reference", add_bos=True, add_eos=True)
    want.choose_backend([])
    _assert_same_group(tok.encode(group, 3), want.encode(group, 3), "kitoken's group")
    assert framed and framed[0][1:] == ([want.info().bos_id], [want.info().eos_id])


@pytest.mark.parametrize("most", [8, 2])
def test_kitoken_encodes_with_as_many_copies_as_calls_ran_at_once(texts, models, most, monkeypatch):
    """Calls sharing one kitoken encoder at once contend for its state: each call takes a copy
    no other holds, loading one while fewer than `KITOKEN_COPIES_BYTES` holds are loaded. Five
    thread pools of four, one after another (a stream's pool is made anew on each retune),
    load no more than four copies (at most `most`), and every call's ids are the one
    encoder's."""
    path = models["sentencepiece"]
    size = os.path.getsize(path) * fast.KITOKEN_BYTES_PER_FILE_BYTE
    monkeypatch.setattr(fast, "KITOKEN_COPIES_BYTES", most * size)
    backend = fast.Kitoken(path)
    groups = [texts[i * 50 : (i + 1) * 50] for i in range(6)]
    want = [backend.encode_framed(g, [1], [2]) for g in groups]
    got: list[list] = []

    def encode(barrier):
        barrier.wait()  # the pool's four threads call at once
        got.append([backend.encode_framed(g, [1], [2]) for g in groups])

    for _ in range(5):
        barrier = threading.Barrier(4)
        pool = [threading.Thread(target=encode, args=(barrier,)) for _ in range(4)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert 1 <= backend.copies() <= min(most, 4)
    assert len(got) == 20
    for each in got:
        for (flat, offsets), (want_flat, want_offsets) in zip(each, want, strict=True):
            assert flat.tolist() == want_flat.tolist() and offsets.tolist() == want_offsets.tolist()


def test_the_audit_checks_one_group_in_audit_every(texts, models):
    tok = _tokenizer(models, "tiktoken", audit_every=3)
    assert tok.choose_backend(texts[:GATE_DOCS]).backend == "fastokens"
    audited = [tok.encode(texts[i : i + 20], i).audited for i in range(0, 200, 20)]
    assert audited == [i % 3 == 0 for i in range(10)]
    assert tok.choice.backend == "fastokens"


def test_auto_does_not_load_kitoken_for_a_unigram_model(texts, spm_model, monkeypatch):
    """kitoken differed from sentencepiece on every unigram model measured: "auto" serves one
    by the reference without loading kitoken, saying why; named, kitoken meets the gate."""
    loads = []
    real = SentencepieceTokenizer.load_backend
    monkeypatch.setattr(
        SentencepieceTokenizer, "load_backend", lambda self, n: loads.append(n) or real(self, n)
    )
    monkeypatch.setattr(route, "_BACKENDS", collections.OrderedDict())
    auto = load_tokenizer(TokenizerSpec(model=spm_model))  # the fixture's unigram model
    choice = auto.choose_backend(texts[:GATE_DOCS])
    assert choice.backend == "reference" and loads == []
    assert choice.why.startswith("kitoken is not tried on unigram models"), choice.why
    named = load_tokenizer(TokenizerSpec(model=spm_model, backend="kitoken"))
    assert named.choose_backend(texts[:GATE_DOCS]).backend == "reference"
    assert loads == ["kitoken"]  # tried, and refused by the gate


def test_kitoken_is_refused_on_a_model_that_normalizes(texts, models):
    """kitoken differs from sentencepiece under NFKC: the gate's probes show it, and "auto" and
    a stream naming kitoken alike are served by the reference."""
    ref = _tokenizer(models, "nfkc", backend="reference")
    for backend in ("auto", "kitoken"):
        tok = _tokenizer(models, "nfkc", backend=backend, audit_every=1)
        choice = tok.choose_backend(texts[:GATE_DOCS])
        assert choice.backend == "reference", choice.why
        assert (
            choice.why.startswith("kitoken ") and "failed the gate on the probe set" in choice.why
        )
        assert tok.choice == choice and tok.router.serving_backend() is None
        got = tok.encode(texts[:GROUP], 0, TRIM)
        _assert_same_group(got, ref.encode(texts[:GROUP], 0, TRIM), backend)
        assert not got.audited  # the reference serves: nothing to audit


# -- `tokenizer.backend`: who tokenizes, never what ------------------------------------------------


@pytest.mark.parametrize("kind", list(BACKEND))
def test_reference_never_loads_a_backend(texts, models, kind, corpus_file, monkeypatch):
    loaded = []

    def load(self, name):
        loaded.append(name)
        raise RuntimeError("no backend may load")

    monkeypatch.setattr(KINDS[kind], "load_backend", load)
    monkeypatch.setattr(route.Router, "loaded_backend", load)  # nor one loaded before
    tok = _tokenizer(models, kind, backend="reference", audit_every=1)
    choice = tok.choose_backend(texts[:GATE_DOCS])
    assert choice.backend == "reference" and "asked for" in choice.why, choice.why
    assert not tok.encode(texts[:GROUP], 0, TRIM).audited
    if kind == "tiktoken":  # and a pipeline of it, which chooses on its sample
        pipeline = Pipeline(_spec(corpus_file, models[kind], "reference"), audit_every=1)
        assert pipeline.tokenizer.choice.backend == "reference"
    assert loaded == []


@pytest.mark.parametrize(
    "kind, backend",
    [("tiktoken", "kitoken"), ("huggingface", "kitoken"), ("sentencepiece", "fastokens")],
)
def test_a_backend_that_does_not_serve_the_kind_is_refused(models, kind, backend):
    tok = _tokenizer(models, kind, backend=backend)
    with pytest.raises(InvalidSpecError) as e:
        tok.choose_backend([])
    assert "`tokenizer.backend`" in str(e.value) and repr(backend) in str(e.value)
    assert BACKEND[kind] in str(e.value)  # the way out: the backend that does serve it


def test_the_client_refuses_an_unknown_backend(models):
    with pytest.raises(SpecError) as e:
        PipelineSpec(
            source={"paths": ["x.jsonl"]},
            tokenizer={"model": models["tiktoken"], "kind": "tiktoken", "backend": "fast"},
        )
    assert e.value.key == "tokenizer.backend" and "fastokens" in str(e.value)


def test_the_backend_is_not_data_and_round_trips(models, tmp_path):
    base = PipelineSpec(
        source={"paths": [str(tmp_path / "x.jsonl")]},
        tokenizer={"model": models["tiktoken"], "kind": "tiktoken"},
    )
    specs = {b: base.replace(tokenizer={"backend": b}) for b in ("reference", "fastokens")}
    specs["auto"] = base
    assert {s.data_fingerprint() for s in specs.values()} == {base.data_fingerprint()}
    assert base.replace(tokenizer={"add_eos": False}).data_fingerprint() != (
        base.data_fingerprint()
    )
    for backend, spec in specs.items():
        assert spec.tokenizer.backend == backend
        assert PipelineSpec.from_proto(spec.to_proto()) == spec
        toml = spec.to_toml()
        # "auto" is left out, so a spec written before the key keeps its text
        assert (f'\nbackend = "{backend}"\n' in toml) == (backend != "auto"), toml
        (tmp_path / f"{backend}.toml").write_text(toml)
        assert PipelineSpec.from_toml(tmp_path / f"{backend}.toml") == spec


def test_pipelines_of_either_backend_resume_each_others_states(corpus_file, models):
    auto = _spec(corpus_file, models["tiktoken"])
    reference = _spec(corpus_file, models["tiktoken"], "reference")
    a = run_pipeline(auto, threads=1, limit=12)
    b = run_pipeline(reference, threads=1, limit=12)
    assert_same_batches([p.batch.arrays() for p in a], [p.batch.arrays() for p in b])
    resumed = run_pipeline(reference, a[5].state, threads=1, limit=6)
    assert_same_batches([p.batch.arrays() for p in resumed], [p.batch.arrays() for p in a[6:]])


# -- backends that are wrong: the gate, then the audit ---------------------------------------------


@pytest.mark.parametrize(
    "wrong_on, why",
    [
        ("every text", "the probe set"),
        ("a word of the first documents", "the stream's first documents"),
    ],
)
def test_the_gate_refuses_a_backend_wrong_from_the_start(texts, models, wrong_on, why):
    if wrong_on == "every text":
        kind = skewed_kind(lambda text: True, own_version())
    else:
        word, at = first_new_word(texts, 0)
        assert at < GATE_DOCS
        kind = skewed_kind(lambda text: word in text, own_version())
    tok = kind(TokenizerSpec(model=models["tiktoken"], kind="tiktoken"))
    choice = tok.choose_backend(texts[:GATE_DOCS])
    assert choice.backend == "reference"
    assert choice.why.startswith("fastokens test-") and f"gate on {why}" in choice.why, choice.why
    assert tok.router.serving_backend() is None
    got = tok.encode(texts[:GROUP], 0, TRIM)
    _assert_same_group(
        got, _tokenizer(models, "tiktoken", "reference").encode(texts[:GROUP], 0, TRIM), why
    )


def test_the_audit_catches_a_backend_wrong_after_the_gate(texts, models):
    word, at = first_new_word(texts, 5 * GROUP // 2)  # in the group after two good ones
    version = own_version()
    kind = skewed_kind(lambda text: word in text, version)
    spec = TokenizerSpec(model=models["tiktoken"], kind="tiktoken", backend="fastokens")
    tok, ref = kind(spec, audit_every=1), _tokenizer(models, "tiktoken", "reference")
    assert tok.choose_backend(texts[:GATE_DOCS]).backend == "fastokens"
    wrong = at // GROUP * GROUP  # the group holding the word
    for i in range(0, len(texts), GROUP):
        got = tok.encode(texts[i : i + GROUP], i, TRIM)
        _assert_same_group(got, ref.encode(texts[i : i + GROUP], i, TRIM), f"group at {i}")
        assert got.audited == (i <= wrong) and got.mismatched == (i == wrong), i
        assert tok.choice.backend == ("fastokens" if i < wrong else "reference"), i
    assert tok.choice.why.startswith("an audit found fastokens test-")
    assert f"documents {wrong} to {wrong + GROUP - 1}" in tok.choice.why

    # The model's next stream skips the backend; the same backend of another version is gated.
    assert backends._PROBED[tok.digest(), "fastokens", version] == tok.choice.why
    again = kind(spec).choose_backend(texts[:GATE_DOCS])
    assert again.backend == "reference" and "an audit found" in again.why, again.why
    next_version = skewed_kind(lambda text: word in text, version + "-next")(spec)
    assert next_version.choose_backend(texts[:GATE_DOCS]).backend == "fastokens"


def test_a_pipelines_audit_serves_the_references_batches(texts, models, corpus_file, monkeypatch):
    """In a pipeline, a backend wrong after the first group: the batches are the reference's,
    the meter counts the audits, and the pipeline's tokenizer and the model's next pipeline
    move to the reference."""
    spec = _spec(corpus_file, models["tiktoken"])
    want = run_pipeline(spec.replace(tokenizer={"backend": "reference"}), threads=1)
    word, at = first_new_word(texts, 2000)
    monkeypatch.setitem(KINDS, "tiktoken", skewed_kind(lambda text: word in text, own_version()))
    pipeline = Pipeline(spec, audit_every=1)
    assert pipeline.tokenizer.choice.backend == "fastokens"
    assert at >= pipeline.group_size  # the first group is audited and found right
    meter = LiveMeter()
    with pipeline.stream(parallelism=Parallelism(0, 1), meter=meter) as stream:
        got = list(stream)
    assert_same_batches([p.batch.arrays() for p in got], [p.batch.arrays() for p in want])
    # Every group the backend made was audited (audit_every=1), up to the one that differed.
    made = at // pipeline.group_size + 1
    assert meter.audits() == (made, made, 1)
    assert pipeline.tokenizer.choice.backend == "reference"
    assert "an audit found" in pipeline.tokenizer.choice.why
    assert Pipeline(spec).tokenizer.choice.backend == "reference"


# -- a real server -----------------------------------------------------------------------------


@pytest.mark.parametrize("processes", [0, 2])
def test_a_served_stream_says_who_tokenized_it(corpus_file, models, short_tmp, processes):
    """A tiktoken stream served by fastokens, audited on every group (in the server, or in
    its worker processes), gives the reference's batches byte for byte; `info` says who
    tokenized it, why, and how many groups were audited; so do the totals and the metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    from input_server.serving.server import Server, ServerConfig

    auto = _spec(corpus_file, models["tiktoken"], count=processes)
    reference = auto.replace(tokenizer={"backend": "reference"})
    config = ServerConfig(
        listen=[f"unix://{short_tmp}/s.sock"], tokenizer_audit_every=1, metrics_port=0
    )
    with Server(config) as srv, InputClient(srv.targets[0]) as client:
        # The backend loads in the server behind a first stream (test_backend_behind.py):
        # the next stream's every group is fastokens'.
        with client.batches(_spec(corpus_file, models["tiktoken"])) as it:
            next(it)
            deadline = time.monotonic() + 60
            while client.info().streams[0].tokenizer_backend_why.startswith("while "):
                assert time.monotonic() < deadline
                time.sleep(0.02)
        streams = {}
        for name, spec in (("auto", auto), ("reference", reference)):
            with client.batches(spec) as it:
                got = [next(it)]
                # the newest: the stream before may still be closing
                streams[name] = max(client.info().streams, key=lambda s: s.stream_id)
                got += list(it)
            streams[name, "batches"] = got
        totals = client.info().totals
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics") as r:
            page = r.read().decode()
    assert len(streams["auto", "batches"]) > 20
    assert_same_batches(streams["auto", "batches"], streams["reference", "batches"])
    fast, ref = streams["auto"], streams["reference"]
    assert fast.tokenizer_backend == "fastokens"
    assert "gave the reference's ids" in fast.tokenizer_backend_why
    assert fast.audited_groups > 0 and fast.audit_mismatches == 0
    assert fast.backend_failed_groups == 0 and totals.backend_failed_groups == 0
    assert ref.tokenizer_backend == "reference" and "asked for" in ref.tokenizer_backend_why
    assert ref.audited_groups == 0
    # All of the auto stream's groups were audited by the time it ended.
    assert totals.audited_groups >= fast.audited_groups and totals.audit_mismatches == 0
    samples = {s.name: s.value for f in text_string_to_metric_families(page) for s in f.samples}
    assert samples["input_server_tokenizer_audited_groups_total"] == totals.audited_groups
    assert samples["input_server_tokenizer_audit_mismatches_total"] == 0
    assert samples["input_server_tokenizer_backend_failed_groups_total"] == 0


def test_the_server_refuses_a_backend_by_name(corpus_file, models, server):
    """A backend that does not serve the kind, or an unknown one sent past the client: each an
    INVALID_ARGUMENT that names `tokenizer.backend`."""
    spec = _spec(corpus_file, models["tiktoken"], "kitoken")
    with InputClient(server.targets[0]) as client, pytest.raises(StreamError) as e:
        with client.batches(spec) as it:
            next(it)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "`tokenizer.backend` 'kitoken'" in e.value.details, e.value.details
    raw = _spec(corpus_file, models["tiktoken"]).to_proto()
    raw.tokenizer.backend = "fast"
    code, details, _ = stream_status(server.targets[0], raw)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "tokenizer.backend" in details, details
