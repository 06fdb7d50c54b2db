"""A stream ahead of its loop audits every group its fast backend makes (`AuditPace`,
`Router.audit_share`), so a divergence the gate missed does not reach a batch unseen; the share
of groups verified is in `info`, `stats` and the totals."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from input_client import InputClient, PipelineSpec
from input_server.cli.stats import format_stream
from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl
from input_server.data.tokenizers import KINDS
from input_server.data.tokenizers.trainers import write_tiktoken_model
from input_server.serving import audit_pace
from input_server.serving.audit_pace import AuditPace
from input_server.serving.config import ServerConfig
from input_server.serving.idle_cpu import host_idle_s
from input_server.serving.server import Server
from tests.support import assert_same_batches
from tests.support.backends import own_version, skewed_kind

PACE_S = 0.05  # the loop's step: far slower than the stream makes batches


class _Idle:
    """The host's idle cores as `IdleCpu` reads them, set by the test: the host's load is not
    the project's (None: the kernel does not say, as on gVisor)."""

    def __init__(self, cores: float | None):
        self.value = cores

    def cores(self) -> float | None:
        return self.value


@pytest.fixture
def idle_host(monkeypatch):
    """Every stream's audit pace sees an idle host (2 cores), whatever the suite runs beside."""
    monkeypatch.setattr(audit_pace, "IdleCpu", lambda: _Idle(2.0))


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_share_audited_grows_with_the_producers_waits_and_halves_without():
    clock = _Clock()
    pace = AuditPace(clock, idle=_Idle(2.0))  # an idle host: the waits decide

    def run(n: int, wait: float) -> list[float]:
        out = []
        for _ in range(n):
            clock.now += 0.01
            out.append(pace.waited(wait * 0.01))
        return out

    waiting = run(40, 0.9)  # waiting 90 % of each interval: room to spare
    assert waiting[-1] == 1.0, waiting
    assert all(b >= a for a, b in zip(waiting, waiting[1:], strict=False))  # it only grows
    held = run(3, 0.0)  # the mean moves slowly: a few batches without a wait keep it
    assert held == [1.0] * 3, held
    falling = run(200, 0.0)  # the waits' mean decays over a few messages, then it halves
    assert falling[-1] == 0.0 and falling[40] == 1.0, falling
    run(40, 0.9)
    assert pace.share == 1.0
    steady = run(150, 0.17)[-20:]  # between LOW and HIGH, settled: it stays where it got to
    assert len(set(steady)) == 1, steady


def test_the_share_grows_only_while_the_host_has_idle_cores():
    clock, idle = _Clock(), _Idle(2.0)
    pace = AuditPace(clock, idle=idle)

    def run(n: int) -> float:
        for _ in range(n):
            clock.now += 0.01
            pace.waited(0.009)  # the producer waits 90 %: room to spare in the stream
        return pace.share

    assert run(40) == 1.0  # an idle host: every group
    idle.value = 0.1  # the cores taken (a CPU-bound client beside it): the share halves away
    assert run(20) == 0.0
    idle.value = 0.5  # between the bounds: it stays where it is
    assert run(20) == 0.0
    idle.value = 1.0
    assert run(40) == 1.0
    idle.value = None  # the kernel does not say (gVisor): no idle CPU seen, none taken
    assert run(20) == 0.0
    assert run(40) == 0.0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit-spare")
    texts = stdlib_docstrings()  # ~7 groups (`GROUP_CHARS` of text each) an epoch
    model = write_tiktoken_model(texts[:500], d / "spare.tiktoken", vocab_size=700)
    return texts, write_jsonl(texts, d / "docs.jsonl"), model


def _spec(data: str, model: str, epochs: int = 1, **tokenizer) -> PipelineSpec:
    # The backend named: "auto" would put it on trial against the reference over the first
    # groups, which this file does not count.
    tokenizer = {"backend": "fastokens", **tokenizer}
    return PipelineSpec(
        source={"paths": [data]},
        tokenizer={"model": model, "kind": "tiktoken", **tokenizer},
        batch={"seq_len": 1024, "size": 16},
        order={"shuffle": False, "epochs": epochs},
        workers={"count": 0, "threads": 1},
    )


def _slowly(it, n: int) -> list:
    got = []
    for batch in it:
        got.append(batch)
        if len(got) == n:
            break
        time.sleep(PACE_S)
    return got


def _slowly_until_chosen(it, client, most: int = 40) -> list:
    """Batches taken at the loop's pace until the stream's backend is chosen (it loads behind
    the stream's first group: `tokenizers.behind`), at most `most`."""
    got = []
    for batch in it:
        got.append(batch)
        streams = client.info().streams  # none: the stream ended (the test then says so)
        if not streams or not max(streams, key=lambda x: x.stream_id).tokenizer_backend_pending:
            break
        if len(got) == most:
            break
        time.sleep(PACE_S)
    return got


def test_a_slow_loop_gets_every_group_audited_and_info_says_the_share(files, short_tmp, idle_host):
    texts, data, model = files
    config = ServerConfig(listen=[f"unix://{short_tmp}/s.sock"])  # audit_every: the default
    with Server(config) as srv, InputClient(srv.targets[0]) as client:
        with client.batches(_spec(data, model, epochs=0)) as it:  # endless
            _slowly(it, 120)
            s = max(client.info().streams, key=lambda x: x.stream_id)
        totals = client.info().totals
    assert s.tokenizer_backend == "fastokens", s.tokenizer_backend_why
    # One group in 64 without room to spare; most here (the first few came before the
    # producer's waits showed).
    assert s.backend_groups >= 10 and s.audited_groups >= 0.6 * s.backend_groups, s
    assert s.audit_mismatches == 0
    assert totals.backend_groups >= s.backend_groups and totals.audited_groups >= s.audited_groups
    words = "\n".join(format_stream(s))
    assert f"{s.audited_groups:,} of {s.backend_groups:,} groups audited" in words, words


def test_a_divergence_past_the_gate_never_reaches_a_slow_loops_batches(
    files, short_tmp, monkeypatch, tmp_path, idle_host
):
    texts, _, model = files
    # A word in one document about 20 groups in (~7 an epoch of the docstrings): the stream has
    # been waiting on its loop long before, and one group in 64 would not audit its group.
    word = "Quixotrandemonium"
    assert not any(word in t for t in texts)
    docs = [*texts, *texts, *texts, f"A {word} here.", *texts[:1000]]
    data = write_jsonl(docs, tmp_path / "planted.jsonl")
    monkeypatch.setitem(KINDS, "tiktoken", skewed_kind(lambda text: word in text, own_version()))
    roots = [str(tmp_path), os.path.dirname(model)]
    config = ServerConfig(listen=[f"unix://{short_tmp}/s.sock"], data_roots=roots)
    with Server(config) as srv, InputClient(srv.targets[0]) as client:
        with client.batches(_spec(data, model)) as it:
            first = _slowly_until_chosen(it, client)
            s = max(client.info().streams, key=lambda x: x.stream_id)
            assert s.tokenizer_backend == "fastokens", s.tokenizer_backend_why
            got = first + _slowly(it, 10_000)
        with client.batches(_spec(data, model, backend="reference")) as it:
            want = list(it)
        totals = client.info().totals
    assert_same_batches(got, want)  # the wrong group was the reference's
    assert totals.audit_mismatches == 1, totals


@pytest.mark.skipif(host_idle_s() is None, reason="/proc/stat does not count here (gVisor)")
def test_a_slow_loop_on_a_busy_host_leaves_its_cores_alone(files, short_tmp):
    # Processes beside the server take every core (as a CPU-bound client on the same host
    # does); the loop is slow, so the producer waits, which alone would audit every group.
    # The real host's idle CPU is read: the share halves away, one group in 64 is audited.
    texts, data, model = files
    burn = "import time\nt = time.monotonic() + 60\nwhile time.monotonic() < t:\n    pass\n"
    cores = len(os.sched_getaffinity(0))
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(cores)]
    try:
        config = ServerConfig(listen=[f"unix://{short_tmp}/s.sock"])
        with Server(config) as srv, InputClient(srv.targets[0]) as client:
            with client.batches(_spec(data, model, epochs=0)) as it:
                _slowly(it, 120)
                s = max(client.info().streams, key=lambda x: x.stream_id)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert s.tokenizer_backend == "fastokens", s.tokenizer_backend_why
    assert s.backend_groups >= 10, s
    assert s.audited_groups <= 0.25 * s.backend_groups + 2, s
