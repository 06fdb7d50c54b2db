"""A fast backend serves only where it is faster here: once the gate finds its ids exact, "auto"
puts it on trial against the reference on the stream's own groups (a phase of each, under the
stream's own threads), keeps the faster, and tries the other again later; `info` says the
measured ratio either way. A backend named in the spec serves as asked."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from input_client import InputClient, PipelineSpec
from input_client.spec import TokenizerSpec
from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl
from input_server.data.tokenizers import KINDS, route, speed
from input_server.data.tokenizers.route import GATE_DOCS
from input_server.data.tokenizers.tiktoken import TiktokenTokenizer
from input_server.data.tokenizers.trainers import write_tiktoken_model
from input_server.serving.config import ServerConfig
from input_server.serving.server import Server
from tests.support.backends import sleepy_kind

# A call the sleepy backend makes waits this long: far more than the reference takes on a
# group here (tiktoken: 20-60 ms for a server's group of ~64k tokens on a loaded host; a CPU
# burner beside the suite may triple that), no CPU.
DELAY_S = 0.5
GROUP = 250  # documents a group: ~25,000 tokens of the docstrings


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("backend-speed")
    texts = stdlib_docstrings(6000)
    model = write_tiktoken_model(texts[:600], d / "m.tiktoken", vocab_size=800)
    return texts, write_jsonl(texts[600:], d / "docs.jsonl"), model


def _groups(tok, texts: list[str], n: int, start: int = 0) -> None:
    for g in range(start, start + n):
        tok.encode(texts[(g * GROUP) % 5000 :][:GROUP], g * GROUP, None)


def test_an_exact_backend_that_is_faster_here_serves_and_says_its_ratio(files):
    texts, _, model = files
    tok = TiktokenTokenizer(TokenizerSpec(model=model, kind="tiktoken"))
    choice = tok.choose_backend(texts[:GATE_DOCS])
    assert choice.backend == "fastokens" and "on trial" in choice.why, choice.why
    assert tok.trials() == (1, True)  # what the live search reads to drop its windows
    _groups(tok, texts, 2 * speed.PHASE_GROUPS)
    assert tok.trials() == (1, False)
    why = tok.choice.why
    assert tok.choice.backend == "fastokens", why
    assert "x the reference's speed on this stream's groups" in why and "on trial" not in why
    assert "the reference serves" not in why


@pytest.mark.parametrize("backend", ["auto", "fastokens"])
def test_an_exact_but_slow_backend_is_tried_and_serves_only_when_named(files, backend):
    texts, _, model = files
    tok = sleepy_kind(TiktokenTokenizer, DELAY_S)(
        TokenizerSpec(model=model, kind="tiktoken", backend=backend)
    )
    choice = tok.choose_backend(texts[:GATE_DOCS])
    assert choice.backend == "fastokens" and "gave the reference's ids" in choice.why
    _groups(tok, texts, 2 * speed.PHASE_GROUPS if backend == "auto" else 4)
    if backend == "auto":
        assert tok.choice.backend == "reference", tok.choice.why
        assert "fastokens" in tok.choice.why and tok.choice.why.endswith("the reference serves")
        assert tok.router.serving_backend() is None
    else:  # asked for by name: no trial, it serves, slow as it is
        assert tok.choice.backend == "fastokens", tok.choice.why
        assert "on trial" not in tok.choice.why and "speed" not in tok.choice.why


def test_a_backend_set_aside_is_tried_again_and_serves_once_faster(files, monkeypatch):
    texts, _, model = files
    monkeypatch.setattr(speed, "RETRIAL_GROUPS", 10)
    monkeypatch.setattr(speed, "MAX_RETRIAL_GROUPS", 10)  # however much slower it was
    kind = sleepy_kind(TiktokenTokenizer, DELAY_S)
    tok = kind(TokenizerSpec(model=model, kind="tiktoken"))
    tok.choose_backend(texts[:GATE_DOCS])
    _groups(tok, texts, 2 * speed.PHASE_GROUPS)
    assert tok.choice.backend == "reference", tok.choice.why
    # The host changes (here: the backend stops sleeping); the next trial sees it. The
    # process's one copy of the backend is the router's.
    tok.router.loaded_backend("fastokens").delay[0] = 0.0
    _groups(tok, texts, 10 + 2 * speed.PHASE_GROUPS, start=100)
    assert tok.choice.backend == "fastokens", tok.choice.why
    assert "x the reference's speed on this stream's groups" in tok.choice.why


def test_a_verdict_is_tried_again_when_the_groups_encoded_at_once_change(files, monkeypatch):
    """A verdict made one group at a time holds while the stream stays so (the backend, slower
    since, keeps serving), and is made again once it encodes four at a time, two windows in a
    row: a backend's speed against the reference's changes with the threads calling it."""
    texts, _, model = files
    monkeypatch.setattr(speed, "CONCURRENCY_GROUPS", 8)
    tok = sleepy_kind(TiktokenTokenizer, 0.0)(TokenizerSpec(model=model, kind="tiktoken"))
    tok.choose_backend(texts[:GATE_DOCS])
    _groups(tok, texts, 2 * speed.PHASE_GROUPS)
    assert tok.choice.backend == "fastokens", tok.choice.why
    tok.router.loaded_backend("fastokens").delay[0] = DELAY_S / 5  # slower from now on
    _groups(tok, texts, 3 * speed.CONCURRENCY_GROUPS, start=100)
    assert tok.choice.backend == "fastokens", tok.choice.why  # one at a time, as judged
    with ThreadPoolExecutor(4) as pool:
        starts = range(200, 200 + 2 * speed.CONCURRENCY_GROUPS + 2 * speed.PHASE_GROUPS)
        list(pool.map(lambda g: _groups(tok, texts, 1, start=g), starts))
    assert tok.choice.backend == "reference", tok.choice.why
    assert tok.choice.why.endswith("the reference serves")


def test_a_paced_stream_keeps_its_verdict(files, monkeypatch, caplog):
    """Groups arriving at a pace: the slow side's groups pile up during its phase (the sleepy
    backend's, ~5 at once) and the serving side's do not (one at a time). The verdict's regime
    is the serving side's, so it is made once, not again each time the pile-up is gone.

    The pace leaves the reference room on a loaded host: a group every 100 ms, which it
    encodes in 5 ms alone. At a group every 25 ms (the sleepy backend taking 100), a full suite
    beside a CPU burner slowed the reference past the pace, its groups piled up too (9,484 ns
    a token: ~240 ms a group), and the sleepy backend read 2 x faster."""
    texts, _, model = files
    monkeypatch.setattr(speed, "CONCURRENCY_GROUPS", 8)
    tok = sleepy_kind(TiktokenTokenizer, 0.0)(TokenizerSpec(model=model, kind="tiktoken"))
    tok.choose_backend(texts[:GATE_DOCS])
    tok.router.loaded_backend("fastokens").delay[0] = DELAY_S  # slow past the gate's probes
    caplog.set_level(logging.INFO, logger=route.__name__)
    with ThreadPoolExecutor(8) as pool:
        done = []
        for g in range(2 * speed.PHASE_GROUPS + 8 * speed.CONCURRENCY_GROUPS):
            done.append(pool.submit(_groups, tok, texts, 1, g))
            time.sleep(DELAY_S / 5)  # a group every 100 ms; the sleepy backend takes 500
        for f in done:
            f.result()
    verdicts = [r for r in caplog.records if "x the reference's speed" in r.getMessage()]
    assert tok.choice.backend == "reference", tok.choice.why
    assert len(verdicts) == 1, [r.getMessage() for r in verdicts]


def test_a_backend_that_keeps_losing_is_tried_ever_less_often():
    lost = speed.Speed(backend="kitoken", groups=16, reference_ns=1000, backend_ns=5000)
    first, second, third = (speed.retrial_after(lost, n) for n in (1, 2, 3))
    assert first == 5 * speed.RETRIAL_GROUPS  # 5 x slower: 5 x as many groups between
    assert second == 2 * first and third == 4 * first
    close = speed.Speed(backend="kitoken", groups=16, reference_ns=1000, backend_ns=950)
    assert speed.retrial_after(close, 1) == speed.RETRIAL_GROUPS  # not faster by enough
    assert speed.retrial_after(lost, 60) == speed.MAX_RETRIAL_GROUPS


def test_info_says_why_a_slow_backend_does_not_serve(files, short_tmp, monkeypatch):
    texts, data, model = files
    monkeypatch.setitem(KINDS, "tiktoken", sleepy_kind(KINDS["tiktoken"], DELAY_S))
    spec = PipelineSpec(
        source={"paths": [data]},
        tokenizer={"model": model, "kind": "tiktoken"},
        batch={"seq_len": 1024, "size": 16},
        order={"epochs": 0},
        workers={"count": 0, "threads": 2},
    )
    with (
        Server(ServerConfig(listen=[f"unix://{short_tmp}/s.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec) as it,
    ):
        # The gate (the stand-in sleeps on each call), the trial's 48 groups (~400 batches),
        # then the verdict: bounded by time, not batches (a quiet host makes them faster than
        # the sleeping gate ends).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            next(it)
            s = max(client.info().streams, key=lambda x: x.stream_id)
            if "the reference serves" in s.tokenizer_backend_why:
                break
    assert s.tokenizer_backend == "reference", s.tokenizer_backend_why
    assert "fastokens" in s.tokenizer_backend_why, s.tokenizer_backend_why
    assert "x the reference's speed on this stream's groups" in s.tokenizer_backend_why
