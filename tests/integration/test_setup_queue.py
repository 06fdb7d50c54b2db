"""The server's set-up queue (`batching/pacing.py`) against a real server on a Unix socket:
a client flooding it with the largest resharded state the bounds admit, from many threads,
keeps no other client's resumed stream out, and that stream's batches are the in-process
pipeline's; a fresh stream refused because the queue is full of other clients' requests
waits for a place and starts (said once); a refusal for the request's own budget is not
retried."""

from __future__ import annotations

import json
import queue
import sys
import threading
import time

import grpc
import pytest

from input_client import InputClient, PipelineSpec, StreamError
from input_client.proto import pb, pb_grpc
from input_client.wire import CLIENT_KEY, PROTOCOL_VERSION
from input_server.testing.processes import ChildProcess
from input_server.testing.reference import run_pipeline
from tests.support import ROOT, assert_same_batches, client_warnings, serve_files
from tests.support.mixture import OLD, mixture_spec, new_host_state, stream_state, write_mixture

HONEST = 1024  # the honest resume's old hosts
FILLER = 512  # old hosts of the states that fill the queue: each reads in about a second, paced
FLOOD_THREADS = 18
TAKE = 12  # batches of the honest stream compared with the in-process pipeline's
WAITING = "waiting for a place in its set-up queue"
FULL = "set-up queue is full"
# What a refusal for the full queue says, in this release's words and the one's before.
QUEUED = "to set up large resumed states"


def _mixture(folder: str, shard: tuple[int, int]) -> PipelineSpec:
    """The mixture's shard, two rows of 64 a batch."""
    return mixture_spec(folder, shard, size=2)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server of the mixture's files, with room for the flood's streams and the honest
    one's (the default is 8 streams); its target and the mixture's folder."""
    folder = str(tmp_path_factory.mktemp("setup-queue"))
    first = write_mixture(folder)
    flags = ("--max-streams", "32", "--stream-memory-mb", "256")
    child, target = serve_files(folder, first, flags=flags, name="sq")
    try:
        yield target, folder
    finally:
        child.kill()


def _resumed(target: str, folder: str, hosts: int, took: int) -> dict:
    """The state of the one new host of a run of `hosts` old ones, the first 4 of which took
    `took` batches each (the others none): `reshard` of their real states."""
    with InputClient(target) as client:
        states = [
            stream_state(client, _mixture(folder, (i, hosts)), batches=took) for i in range(4)
        ]
    return new_host_state(states, hosts)


@pytest.fixture(scope="module")
def maximal(served) -> bytes:
    """A serialized request resuming from the largest state the bounds admit."""
    target, folder = served
    state = _resumed(target, folder, OLD, 20)
    request = pb.StreamBatchesRequest(
        spec=_mixture(folder, (0, 1)).to_proto(),
        protocol_version=PROTOCOL_VERSION,
        resume_state=json.dumps(state).encode(),
    )
    return request.SerializeToString()


@pytest.fixture(scope="module")
def honest(served) -> dict:
    target, folder = served
    return _resumed(target, folder, HONEST, 3)


@pytest.fixture
def said():
    """The client's warnings, as they come (`client_warnings`)."""
    with client_warnings() as handler:
        yield handler


def _flood(target: str, request: bytes, folder, *extra: str) -> tuple[ChildProcess, list]:
    """`tests/setup_flood.py`: FLOOD_THREADS threads re-sending `request` at once, in a
    process of their own; returns once its queue of outcomes shows the set-up queue full."""
    path = f"{folder}/flood.request"
    with open(path, "wb") as f:
        f.write(request)
    argv = [sys.executable, str(ROOT / "tests" / "setup_flood.py"), target, path]
    child = ChildProcess(
        [*argv, str(FLOOD_THREADS), *extra], log=f"{folder}/flood.log", read_lines=True
    )
    outcomes: list = []
    end = time.monotonic() + 60
    try:
        while not any(QUEUED in o["details"] for o in outcomes):
            assert time.monotonic() < end, f"the flood never filled the queue: {outcomes[-5:]}"
            try:
                line = child.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                continue
            assert line is not None, f"the flood ended: {outcomes[-5:]}"
            outcomes.append(json.loads(line))
    except BaseException:
        child.kill()
        raise
    return child, outcomes


def _outcomes(child: ChildProcess, outcomes: list) -> list:
    child.kill()
    while (line := child.lines.get(timeout=10)) is not None:
        outcomes.append(json.loads(line))
    return outcomes


@pytest.mark.parametrize(
    "flood_names",
    [(), ("one-client",)],
    ids=["raw-grpc-calls", "calls-naming-one-client"],
)
def test_a_flood_of_maximal_states_keeps_no_other_client_out(
    served, maximal, honest, said, flood_names
):
    target, folder = served
    spec = _mixture(folder, (0, 1))
    child, outcomes = _flood(target, maximal, folder, *flood_names)
    try:
        start = time.monotonic()
        with InputClient(target, connect_timeout_s=5) as client:
            with client.batches(spec, state=honest) as it:
                got = [dict(next(it)) for _ in range(TAKE)]
        took = time.monotonic() - start
    finally:
        outcomes = _outcomes(child, outcomes)
    codes = [o["code"] for o in outcomes]
    print(f"honest resume of {HONEST} hosts: {took:.1f} s under the flood; the flood's calls: "
          f"{ {c: codes.count(c) for c in set(codes)} }")  # fmt: skip
    # The flood held its share of the queue throughout (refused past it), and the honest
    # stream was never refused: it took a place from the flood.
    assert codes.count("RESOURCE_EXHAUSTED") >= 1, outcomes[-5:]
    assert not [line for line in said.lines if WAITING in line], said.lines
    want = [p.arrays for p in run_pipeline(spec, honest, limit=TAKE)]
    assert_same_batches(got, want)


def _fill(target: str, request: bytes, calls: int) -> tuple[list, list]:
    """`calls` calls of `request` at once, each naming a client of its own (so that none may
    take another's place); returns once one is refused for the full queue: the calls (to
    cancel) and what each came to."""
    outcomes, made = [], []
    parsed = pb.StreamBatchesRequest.FromString(request)

    def one(i: int) -> None:
        channel = grpc.insecure_channel(target)
        stub = pb_grpc.InputServiceStub(channel)
        call = stub.StreamBatches(iter([parsed]), timeout=300, metadata=((CLIENT_KEY, f"f{i}"),))
        made.append((call, channel))
        try:
            next(call)
            outcomes.append("OK")
        except grpc.RpcError as e:
            outcomes.append(e.details() or e.code().name)

    for i in range(calls):
        threading.Thread(target=one, args=(i,), daemon=True).start()
    end = time.monotonic() + 60
    try:
        while not any(QUEUED in o for o in outcomes):
            assert time.monotonic() < end, f"the queue never filled: {outcomes}"
            time.sleep(0.05)
    except BaseException:
        _cancel(made)
        raise
    return made, outcomes


def _cancel(calls: list) -> None:
    for call, channel in calls:
        call.cancel()
        channel.close()


def test_a_fresh_stream_refused_by_a_full_set_up_queue_waits_for_a_place(served, said):
    target, folder = served
    spec = _mixture(folder, (0, 1))
    state = _resumed(target, folder, FILLER, 3)
    request = pb.StreamBatchesRequest(
        spec=spec.to_proto(),
        protocol_version=PROTOCOL_VERSION,
        resume_state=json.dumps(state).encode(),
    ).SerializeToString()
    # One paced, 16 waiting and more: each client at its share (one place), so the stream
    # below, of a client of its own, may take none of theirs.
    calls, outcomes = _fill(target, request, 24)
    try:
        start = time.monotonic()
        with InputClient(target, connect_timeout_s=120) as client:
            with client.batches(spec, state=state) as it:
                got = [dict(next(it)) for _ in range(TAKE)]
        print(f"started after {time.monotonic() - start:.1f} s; of the others, "
              f"{outcomes.count('OK')} started and {len(outcomes) - outcomes.count('OK')} "
              f"were refused")  # fmt: skip
    finally:
        _cancel(calls)
    waited = [line for line in said.lines if WAITING in line]
    assert len(waited) == 1, said.lines  # said once, however many tries it took
    assert FULL in waited[0] and "up to 120 s" in waited[0], waited[0]
    want = [p.arrays for p in run_pipeline(spec, state, limit=TAKE)]
    assert_same_batches(got, want)


def test_a_refusal_for_the_requests_own_budget_is_not_retried(served, said):
    target, folder = served
    spec = _mixture(folder, (0, 1))
    huge = PipelineSpec.from_dict({**spec.to_dict(), "batch": {"seq_len": 65536, "size": 512}})
    start = time.monotonic()
    with InputClient(target, connect_timeout_s=60) as client, pytest.raises(StreamError) as e:
        with client.batches(huge) as it:
            next(it)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
    assert "--stream-memory-mb" in e.value.details, e.value.details
    assert time.monotonic() - start < 30  # not waited for
    assert not [line for line in said.lines if WAITING in line], said.lines
