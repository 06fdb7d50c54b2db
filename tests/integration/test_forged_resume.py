"""Forged resharded states against a real server (`input-server serve` on a Unix socket, real
Grain): the largest state the bounds admit (4,096 old streams of a 16-component mixture, one
of them 62 epochs ahead of the rest, made with the client's own `reshard`), sent from 8 calls
at once, leaves another client's running stream its rate; a deal that does not match the
spec's shard is refused by name; an honest resharded resume is the in-process stream's, byte
for byte."""

from __future__ import annotations

import json
import os
import threading
import time

import grpc
import pytest

from input_client import InputClient, PipelineSpec, StreamError, reshard
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION
from input_server.testing.reference import run_pipeline
from tests.support import assert_same_batches, serve_files
from tests.support.mixture import (
    COMPONENTS,
    OLD,
    mixture_spec,
    new_host_state,
    stream_state,
    write_mixture,
)

AHEAD = 62  # epochs the old stream that took batches is ahead, at most: the bound is 64
BASE_S, ATTACK_S, WARM_S = 4.0, 8.0, 2.0


def _mixture(folder: str, shard: tuple[int, int]) -> PipelineSpec:
    """The mixture's shard, a row of 64 a batch."""
    return mixture_spec(folder, shard, size=1)


@pytest.fixture(scope="module")
def served(tmp_path_factory, corpus, spm_model):
    """A server of the mixture's files, the corpus and its model; the mixture's folder."""
    folder = str(tmp_path_factory.mktemp("forged"))
    first = write_mixture(folder)
    # Room for the running stream and the 8 forged ones (the default is 8 streams).
    flags = ("--max-streams", "16")
    child, target = serve_files(folder, first, corpus, spm_model, flags=flags, name="forged")
    try:
        yield child, target, folder
    finally:
        child.kill()


@pytest.fixture(scope="module")
def forged(served) -> bytes:
    """`reshard([s0] + [None] * 4095, 1)`, s0 a real state of shard 0 of 4,096 that is 61 or
    62 epochs into every component (one document of each an epoch; a batch takes 21)."""
    _, target, folder = served
    spec = _mixture(folder, (0, OLD))
    with InputClient(target) as client:
        state = stream_state(client, spec, until_doc=(AHEAD - 1) * COMPONENTS)
    assert state["doc"] < (AHEAD + 1) * COMPONENTS, state["doc"]
    return json.dumps(new_host_state([state], OLD)).encode()


def _cpu_s(pid: int) -> float:
    """The process's user and system CPU seconds (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Running:
    """Another client's stream of real text, read as fast as it comes: each batch's time."""

    def __init__(self, target: str, spec: PipelineSpec):
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(target, spec), daemon=True)
        self._thread.start()

    def _read(self, target: str, spec: PipelineSpec) -> None:
        with InputClient(target) as client, client.batches(spec) as it:
            for _ in it:
                self.times.append(time.monotonic())
                if self._stop.is_set():
                    return

    def rate(self, start: float, end: float) -> float:
        return sum(start <= t < end for t in self.times) / (end - start)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _attack(target: str, spec: PipelineSpec, blob: bytes, calls: int) -> tuple[list, list, list]:
    """`calls` raw calls resuming from `blob` at once, each on its own channel: the calls (to
    cancel), their threads, and what each came to (the first message's time, or its status)."""
    outcomes, live = [], []

    def one() -> None:
        channel = grpc.insecure_channel(target)
        request = pb.StreamBatchesRequest(
            spec=spec.to_proto(), protocol_version=PROTOCOL_VERSION, resume_state=blob
        )
        call = pb_grpc.InputServiceStub(channel).StreamBatches(iter([request]), timeout=120)
        live.append((call, channel))
        try:
            next(call)
            outcomes.append(("served", time.monotonic()))
        except grpc.RpcError as e:
            outcomes.append((e.code().name, e.details()))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(calls)]
    for t in threads:
        t.start()
    return threads, live, outcomes


def _measure(child, target, folder, make_spec, blob) -> tuple[float, float, list]:
    """The running stream's rate while 8 calls resume from the forged state, over its rate
    before and after (their mean: the host's other load drifts), and the server's CPU
    seconds a second beyond the running stream's own in those windows."""
    # Long rows: the server's CPU, not the client, sets its pace.
    spec = make_spec(batch={"seq_len": 1024, "size": 8}, order={"epochs": 0})
    running = _Running(target, spec)
    try:
        time.sleep(WARM_S)
        t0, cpu0 = time.monotonic(), _cpu_s(child.p.pid)
        time.sleep(BASE_S)
        t1, cpu1 = time.monotonic(), _cpu_s(child.p.pid)
        threads, live, outcomes = _attack(target, _mixture(folder, (0, 1)), blob, 8)
        time.sleep(ATTACK_S)
        t2, cpu2 = time.monotonic(), _cpu_s(child.p.pid)
        for call, channel in live:  # the attackers leave: their places in the gate go
            call.cancel()
            channel.close()
        for t in threads:
            t.join(30)
        time.sleep(1.0)
        t3, cpu3 = time.monotonic(), _cpu_s(child.p.pid)
        time.sleep(BASE_S)
        t4, cpu4 = time.monotonic(), _cpu_s(child.p.pid)
    finally:
        running.stop()
    before, during, after = running.rate(t0, t1), running.rate(t1, t2), running.rate(t3, t4)
    quiet = ((cpu1 - cpu0) / (t1 - t0) + (cpu4 - cpu3) / (t4 - t3)) / 2
    extra = (cpu2 - cpu1) / (t2 - t1) - quiet
    print(f"running stream: {before:.1f} / {during:.1f} / {after:.1f} batches/s before, during, "
          f"after; server CPU {quiet:.2f} s/s quiet, +{extra:.2f} s/s under attack; "
          f"{outcomes}")  # fmt: skip
    assert before > 0 and after > 0, "the running stream did not flow"
    return during / ((before + after) / 2), extra, outcomes


def test_forged_maximal_states_leave_a_running_stream_its_rate(served, forged, make_spec):
    child, target, folder = served
    blob = forged
    assert len(blob) > 90_000  # 4,096 old streams' states
    # The host's other load moves a rate by more than the bound now and then: more tries, not
    # a looser bound (without the gate, each came to 0.2-0.5 here; a suite run on a quiet
    # 2-core host read 0.790 and 0.788 in two tries with it).
    ratios = []
    for _ in range(3):
        ratio, extra, outcomes = _measure(child, target, folder, make_spec, blob)
        ratios.append(ratio)
        if ratio >= 0.8:
            break
    assert ratio >= 0.8, f"the running stream kept {ratios} of its rate"
    # Read at 1/20 of a core, one at a time: at most one or two served in the window; the
    # rest waited their turn until they left (none refused for anything but the queue).
    assert sum(o[0] == "served" for o in outcomes) <= 2, outcomes
    assert all(o[0] in ("served", "CANCELLED", "RESOURCE_EXHAUSTED") for o in outcomes), outcomes
    assert extra < 0.35, f"the forged states took {extra:.2f} s of CPU a second"


def test_a_forged_state_once_read_is_served(served, forged):
    """Alone, the maximal state is read (paced: about 0.6 s of CPU at 1/20 of a core) and
    streams its dealt documents."""
    child, target, folder = served
    blob = forged
    spec = _mixture(folder, (0, 1))
    start, cpu = time.monotonic(), _cpu_s(child.p.pid)
    with InputClient(target) as client:
        state = json.loads(blob)
        with client.batches(spec, state=state) as it:
            first = next(it)
    took, used = time.monotonic() - start, _cpu_s(child.p.pid) - cpu
    print(f"first batch of the forged state after {took:.1f} s, {used:.2f} s of server CPU")
    assert first["inputs"].shape == (1, 64)
    assert used < 2.5, used  # 9 s before ReshardedOrder stopped writing R_e out whole


def _one_source(corpus, spm_model, shard) -> PipelineSpec:
    return PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": spm_model},
        batch={"seq_len": 128, "size": 2},
        order={"seed": 3, "epochs": 1},
        shard={"index": shard[0], "count": shard[1]},
        workers={"count": 0},
    )


def _states(target, corpus, spm_model, count, takes) -> list:
    states = []
    with InputClient(target) as client:
        for i, take in zip(range(count), takes, strict=False):
            with client.batches(_one_source(corpus, spm_model, (i, count))) as it:
                for _ in range(take):
                    next(it)
                states.append(json.loads(json.dumps(it.get_state())))
    return states


def test_a_deal_that_does_not_match_the_shard_is_refused_by_name(served, corpus, spm_model):
    _, target, _ = served
    new = reshard(_states(target, corpus, spm_model, 2, [2, 3]), 3)
    forged = json.loads(json.dumps(new[1]))
    forged["elastic"]["deal"] = [0, 2]  # shard [1, 3] takes share [1, 3]
    with InputClient(target) as client:
        spec = _one_source(corpus, spm_model, (1, 3))
        with client.batches(spec, state=forged) as it, pytest.raises(StreamError) as e:
            next(it)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert "`resume_state.elastic.deal` is [0, 2]" in e.value.details, e.value.details
    assert "takes share [1, 3]" in e.value.details, e.value.details


def test_honest_resharded_resumes_are_the_in_process_stream_byte_for_byte(
    served, corpus, spm_model
):
    """4 hosts -> 3 -> 5, the 3 resharded again before they read what they were dealt (old
    streams that are themselves resharded): every new host's stream as the server sends it is
    the one the pipeline makes in this process from the same state."""
    _, target, _ = served
    states = reshard(_states(target, corpus, spm_model, 4, [3, 5, 2, 4]), 3)
    again = []
    with InputClient(target) as client:
        for j, state in enumerate(states):
            with client.batches(_one_source(corpus, spm_model, (j, 3)), state=state) as it:
                next(it)
                again.append(json.loads(json.dumps(it.get_state())))
    assert all("elastic" in s for s in again)  # still reading what they were dealt
    for j, state in enumerate(reshard(again, 5)):
        spec = _one_source(corpus, spm_model, (j, 5))
        with InputClient(target) as client, client.batches(spec, state=state) as it:
            got = [dict(b) for b in it]
        want = [p.arrays for p in run_pipeline(spec, state)]
        assert got and len(got) == len(want)
        assert_same_batches(got, want)
