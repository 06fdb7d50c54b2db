"""Work stops when the client leaves, and the server stops when told: cancellation reaches
globbing and tuning, the slot is free before a reconnecting client arrives, a tuning never
holds up another spec's stream, and SIGTERM exits in time whatever a handler is doing, with
health NOT_SERVING for the whole drain."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2

from input_client import InputClient
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION
from input_server.serving.server import Server, ServerConfig
from tests.support import health, serve_cli, worker_processes


def request(spec) -> pb.StreamBatchesRequest:
    return pb.StreamBatchesRequest(spec=spec.to_proto(), protocol_version=PROTOCOL_VERSION)


def cpu_seconds() -> float:
    me = psutil.Process()
    return sum(me.cpu_times()[:2])


def test_a_cancelled_glob_stops_and_frees_its_slot_within_a_second(tmp_path, make_spec):
    """A glob walking the whole disk (seconds of work, up to the walk's bound) for a client
    whose deadline passed: the walk stops, and the one stream slot takes the next client."""
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], data_roots=["/"], max_streams=1)
    with Server(config) as srv, grpc.insecure_channel(srv.targets[0]) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        walk = make_spec(source={"paths": ["/**/no_such_name_*.jsonl"]})
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            list(stub.StreamBatches(iter([request(walk)]), timeout=0.5))
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(1.0)
        # Free: a valid stream is served, not RESOURCE_EXHAUSTED.
        first = next(iter(stub.StreamBatches(iter([request(make_spec())]), timeout=30)))
        assert first.sequence_number == 0
        assert time.monotonic() - start < 8
        # And the walk is no longer burning CPU (this process's: the server runs in it).
        before = cpu_seconds()
        time.sleep(1.0)
        assert cpu_seconds() - before < 0.5


def test_a_reconnecting_client_finds_its_slot_free(tmp_path, make_spec, monkeypatch):
    """After a cancel the slot freed late, at the end of the stream's teardown: 6 of 200
    immediate reconnects got RESOURCE_EXHAUSTED. Here a stream's teardown waits until the
    stream after it is served (a stand-in for a slow one: worker processes stopping on a
    busy host), so a slot freed at the teardown's end would refuse every reconnect, not a few.
    A reconnect may still reach the server before its cancel does (gRPC core can hand the
    server the new call first: one did in a full suite beside a CPU burner); refused, it tries
    again."""
    from input_server.serving.stream import Stream

    teardowns = threading.Semaphore(0)  # one for each stream served after another
    close = Stream.close

    def held_close(self) -> None:
        teardowns.acquire(timeout=60)  # a hang guard: the reconnect below fails first
        close(self)

    monkeypatch.setattr(Stream, "close", held_close)
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], max_streams=1)
    spec = make_spec(order={"epochs": 0})
    at_once = 0
    with Server(config) as srv, grpc.insecure_channel(srv.targets[0]) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        try:
            for i in range(40):
                deadline, tries = time.monotonic() + 30, 0
                while True:
                    call = stub.StreamBatches(iter([request(spec)]), timeout=30)
                    try:
                        next(call)
                        break
                    except grpc.RpcError as e:
                        assert "maximum of 1 streams" in (e.details() or ""), e
                        assert time.monotonic() < deadline, "the slot was held by a teardown"
                        tries += 1
                        time.sleep(0.05)
                at_once += tries == 0
                if i:
                    teardowns.release()  # the stream before this one may end now
                call.cancel()
        finally:
            teardowns.release(100)  # the last stream's, and any a failure left held
    assert at_once >= 30, f"{40 - at_once} of 40 reconnects were refused at first"


def test_a_cancelled_tuning_stops_and_never_held_up_another_spec(tmp_path, make_spec):
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], max_workers=2)
    tuned = make_spec(workers={"count": "auto", "tune_seconds": 60}, order={"epochs": 0})
    other = make_spec(workers={"count": "auto", "tune_seconds": 60}, order={"seed": 9})
    with Server(config) as srv, grpc.insecure_channel(srv.targets[0]) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        outcome = {}

        def tune_then_leave():
            try:
                list(stub.StreamBatches(iter([request(tuned)]), timeout=4))
            except grpc.RpcError as e:
                outcome["code"] = e.code()
                outcome["at"] = time.monotonic()

        leaver = threading.Thread(target=tune_then_leave)
        leaver.start()
        time.sleep(1.0)  # the first spec is tuning now
        start = time.monotonic()
        first = next(iter(stub.StreamBatches(iter([request(other)]), timeout=30)))
        assert first.sequence_number == 0
        assert time.monotonic() - start < 15  # not the 60 s of the first spec's tuning
        leaver.join(30)
        assert outcome["code"] == grpc.StatusCode.DEADLINE_EXCEEDED
        # The tuning's worker processes are gone within about a second of the deadline.
        deadline = outcome["at"] + 5
        while worker_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not worker_processes()
        before = cpu_seconds()
        time.sleep(1.0)
        assert cpu_seconds() - before < 0.5


def test_sigterm_exits_in_time_with_a_stuck_handler_and_health_says_not_serving(
    tmp_path, make_spec
):
    """A stream whose worker is stopped (SIGSTOP) never finishes closing; the server still
    exits within --grace-s and a few seconds, answering NOT_SERVING while it drains."""
    child, targets = serve_cli(
        "--listen", f"unix://{tmp_path}/s.sock", "--grace-s", "2", log=str(tmp_path / "server.log")
    )
    try:
        spec = make_spec(order={"epochs": 0}, workers={"count": 1})
        with (
            InputClient(targets[0], connect_timeout_s=60) as client,
            client.batches(spec, reconnect_deadline_s=0, prefetch=1) as it,
        ):
            next(it)
            workers = [
                p
                for p in psutil.Process(child.p.pid).children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())
            ]
            assert workers
            for w in workers:
                w.suspend()  # SIGSTOP: the stream's close now waits for ever
            start = time.monotonic()
            child.p.send_signal(signal.SIGTERM)
            seen = []  # in order: the first answers may come before the signal is handled
            while child.p.poll() is None and time.monotonic() - start < 15:
                try:
                    seen.append(health(targets[0], ""))
                except grpc.RpcError as e:
                    seen.append(e.code())
                time.sleep(0.1)
            took = time.monotonic() - start
        assert child.p.poll() is not None, "still running 15 s after SIGTERM"
        assert took < 2 + 4, took
        assert child.p.returncode == 1  # the drain was cut short, and says so
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        assert not_serving in seen, seen
        drain = seen[seen.index(not_serving) :]
        assert serving not in drain, seen  # never SERVING again once draining
        assert drain.count(not_serving) >= 5, seen  # answering through the drain (2 s)
        assert not os.path.exists(tmp_path / "s.sock")
    finally:
        child.kill()


def test_a_stream_being_set_up_when_the_server_drains_gets_unavailable(tmp_path, make_spec):
    """UNAVAILABLE, which a client resumes from elsewhere, not CANCELLED, which it does not."""
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], data_roots=["/"], grace_s=3)
    srv = Server(config)
    with grpc.insecure_channel(srv.targets[0]) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        walk = make_spec(source={"paths": ["/**/no_such_name_*.jsonl"]})
        call = stub.StreamBatches(iter([request(walk)]), timeout=30)
        time.sleep(0.5)  # walking
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        with pytest.raises(grpc.RpcError) as e:
            next(call)
        stopper.join(10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
    assert srv.drained
