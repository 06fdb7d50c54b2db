"""Exactly once across server SIGKILLs and trainer restarts; clear errors for bad records and dead
workers. Real server processes, real SIGKILLs, real sockets; every wait is bounded."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from input_client import InputClient, ReconnectError, StreamError
from input_client.proto import pb_grpc
from input_client.wire import MESSAGE_OPTIONS
from input_server.batching.pipeline import Pipeline, Workers
from input_server.serving.server import Server, ServerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAOS = os.path.join(ROOT, "scripts", "chaos.py")


def batch_bytes(batch) -> bytes:
    """All arrays of a batch in name order (what scripts/chaos.py's trainer logs)."""
    return b"".join(batch[k].tobytes() for k in sorted(batch))


def reference(spec) -> list[bytes]:
    """The whole stream of an uninterrupted in-process run."""
    with Pipeline(spec).stream(workers=Workers(0, 2, "reference")) as stream:
        return [batch_bytes(p.arrays) for p in stream]


def assert_stream_equal(got: list[bytes], want: list[bytes]) -> None:
    pairs = enumerate(zip(got, want, strict=False))
    first_diff = next((i for i, (g, w) in pairs if g != w), None)
    assert first_diff is None, f"batch {first_diff} differs from the uninterrupted run"
    assert len(got) == len(want)
    assert b"".join(got) == b"".join(want)  # the token stream, byte for byte


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`input-server serve` as a child process in its own process group: a kill takes the
    server and its worker processes at once, as when a container or host goes."""

    def __init__(self, address: str, log_path: str):
        self.address = address
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "input_server.cli", "serve", "--listen", self.address],
                stdout=log, stderr=log, start_new_session=True, cwd=ROOT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def server_process(tmp_path):
    started = []

    def make(transport: str) -> ServerProcess:
        address = (f"unix://{tmp_path}/input.sock" if transport == "unix"
                   else f"127.0.0.1:{_free_port()}")  # the restarts reuse the port
        srv = ServerProcess(address, str(tmp_path / "server.log"))
        started.append(srv)
        srv.start()
        return srv

    yield make
    for srv in started:
        srv.kill()


def reference_prefix(spec, n: int) -> list[bytes]:
    """The first `n` batches of an uninterrupted in-process run."""
    out = []
    with Pipeline(spec).stream(workers=Workers(0, 2, "reference")) as stream:
        for p in stream:
            out.append(batch_bytes(p.arrays))
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_server_sigkilled_at_random_batches_stream_continues_byte_identical(
        server_process, make_spec, transport):
    """Three SIGKILLs (server and workers), each followed by a restart on the same address.

    gRPC's flow-control window lets the server run a few MB ahead of the caller, so a kill is
    only felt once the caller has used what already arrived: the next kill comes at a random
    count of batches after the stream broke and reconnected, so every kill is one the
    caller's stream really lost.
    """
    spec = make_spec(batch={"seq_len": 1024, "size": 8}, order={"epochs": 0})
    rng = random.Random(f"kills-{transport}")
    srv = server_process(transport)
    got: list[bytes] = []
    kills_at: list[int] = []
    next_kill = rng.randrange(5, 30)
    with InputClient(srv.address, connect_timeout_s=30) as client, \
            client.batches(spec, reconnect_deadline_s=30) as it:
        while True:
            got.append(batch_bytes(next(it)))
            felt = it.reconnects == len(kills_at)  # the last kill broke the stream, if any
            if felt and kills_at and next_kill <= kills_at[-1]:
                next_kill = len(got) + rng.randrange(5, 30)
            if felt and len(got) >= next_kill:
                if len(kills_at) == 3:
                    break  # with batches of the last restarted server's stream in `got`
                srv.kill()
                kills_at.append(len(got))
                time.sleep(rng.uniform(0.0, 0.3))  # down a moment, then "rescheduled"
                srv.start()
            assert len(got) < 5000, f"the kill after batch {kills_at[-1]} never broke the stream"
        assert it.get_state()["seq"] == len(got)
    print(f"killed after batches {kills_at}; {len(got)} batches")
    assert_stream_equal(got, reference_prefix(spec, len(got)))


def _lines(proc: subprocess.Popen) -> queue.Queue:
    q: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            q.put(line.strip())
        q.put(None)

    threading.Thread(target=read, daemon=True).start()
    return q


def test_trainer_sigkilled_restarts_from_saved_state_with_other_worker_counts(
        server, make_spec, tmp_path):
    """The consuming process dies (SIGKILL) and restarts from its checkpoint (the iterator's
    JSON state beside the log it trained on); each restart also changes `workers.count`."""
    spec = make_spec()
    want = reference(spec)
    steps = 150
    paths = {k: str(tmp_path / k) for k in ("ckpt", "log", "spec.json")}
    kill_at = [23, 61, 102]  # between checkpoints (every 5 steps): work since then is redone
    worker_counts = [0, 1, 0, 2]

    def trainer(incarnation: int) -> tuple[subprocess.Popen, queue.Queue]:
        with open(paths["spec.json"], "w") as f:
            json.dump(spec.replace(workers={"count": worker_counts[incarnation]}).to_dict(), f)
        proc = subprocess.Popen(
            [sys.executable, CHAOS, "trainer", "--target", server.targets[0], "--spec",
             paths["spec.json"], "--ckpt", paths["ckpt"], "--log", paths["log"], "--batches",
             str(steps), "--checkpoint-every", "5"],
            stdout=subprocess.PIPE, text=True, cwd=ROOT)
        return proc, _lines(proc)

    incarnation = 0
    proc, lines = trainer(incarnation)
    try:
        while True:
            line = lines.get(timeout=60)
            assert line is not None, f"trainer exited with {proc.wait()} before finishing"
            if line == "done":
                break
            if line.startswith("batch ") and kill_at and int(line.split()[1]) >= kill_at[0]:
                kill_at.pop(0)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                incarnation += 1
                proc, lines = trainer(incarnation)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert incarnation == 3
    with open(paths["log"], "rb") as f:
        logged = f.read()
    size = len(want[0])
    assert_stream_equal([logged[i:i + size] for i in range(0, len(logged), size)], want[:steps])
    with open(paths["ckpt"]) as f:
        assert json.load(f)["state"]["seq"] == steps


def test_drained_server_replaced_on_the_same_socket_continues_exactly(tmp_path, make_spec):
    spec = make_spec(batch={"seq_len": 1024, "size": 8}, order={"epochs": 0})
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], grace_s=1)
    first = Server(config)
    servers: list[Server] = []
    replacement = threading.Timer(0.5, lambda: servers.append(Server(config)))
    got = []
    try:
        with InputClient(first.targets[0]) as client, \
                client.batches(spec, reconnect_deadline_s=30) as it:
            got += [batch_bytes(next(it)) for _ in range(10)]
            first.stop()  # SIGTERM's path: streams end with UNAVAILABLE, the socket goes
            replacement.start()
            while it.reconnects == 0:  # what had arrived before the drain comes first
                got.append(batch_bytes(next(it)))
                assert len(got) < 5000, "the drain never broke the stream"
            got += [batch_bytes(next(it)) for _ in range(10)]
    finally:
        replacement.join()
        for srv in servers:
            srv.stop(0)
    assert_stream_equal(got, reference_prefix(spec, len(got)))


def test_server_gone_for_good_raises_after_the_deadline_not_a_hang(tmp_path, make_spec):
    srv = Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], grace_s=1))
    with InputClient(srv.targets[0]) as client, \
            client.batches(make_spec(order={"epochs": 0}), prefetch=1,
                           reconnect_deadline_s=1.5) as it:
        next(it)
        next(it)
        start = time.monotonic()
        srv.stop()
        with pytest.raises(ReconnectError) as e:
            for _ in range(10_000):
                next(it)
        assert time.monotonic() - start < 10
        assert it.get_state()["seq"] == it.batches_yielded  # still the last batch yielded
    assert e.value.waited_s >= 1.5
    assert e.value.code == grpc.StatusCode.UNAVAILABLE  # a StreamError with the last status
    assert f"unix://{tmp_path}/s.sock" in str(e.value)
    assert "reconnect_deadline_s=1.5" in str(e.value)


class _CuttingProxy(pb_grpc.InputServiceServicer):
    """A gRPC proxy in front of the real server (what a load balancer or sidecar proxy is): it
    ends its first stream cleanly after `cut_after` messages, without the end marker, as a
    proxy closing streams would. With `hog_s`, it first takes the server's only stream slot
    for that long (another trainer's stream, say), so the client's reconnects meet
    RESOURCE_EXHAUSTED, which the proxy passes on, counted in `refused`."""

    def __init__(self, upstream: str, cut_after: int, hog_s: float = 0.0):
        self._channel = grpc.insecure_channel(upstream, options=MESSAGE_OPTIONS)
        self._stub = pb_grpc.InputServiceStub(self._channel)
        self._cut_after, self._hog_s = cut_after, hog_s
        self._release: threading.Timer | None = None
        self.streams = self.refused = 0

    def GetInfo(self, request, context):
        return self._stub.GetInfo(request)

    def StreamBatches(self, request, context):
        self.streams += 1
        first = self.streams == 1
        call = self._stub.StreamBatches(request)
        try:
            for i, message in enumerate(call):
                if first and i == self._cut_after:
                    call.cancel()
                    if self._hog_s:
                        self._hog(request)
                    return  # a clean end: OK status, no end-of-data marker
                yield message
        except grpc.RpcError as e:
            self.refused += e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            context.abort(e.code(), e.details())
        finally:
            call.cancel()

    def _hog(self, request) -> None:
        """Takes the slot the cut stream frees (once the server has let it go), for hog_s."""
        deadline = time.monotonic() + 10
        while True:
            hog = self._stub.StreamBatches(request)
            try:
                next(hog)
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert time.monotonic() < deadline, "the cut stream's slot was never freed"
                time.sleep(0.02)
        self._release = threading.Timer(self._hog_s, hog.cancel)
        self._release.start()

    def close(self) -> None:
        if self._release is not None:
            self._release.cancel()
            self._release.join()
        self._channel.close()


@pytest.fixture
def proxied(tmp_path):
    """`proxied(cut_after, hog_s)`: the target of a `_CuttingProxy` in front of a real server
    that runs one stream at a time."""
    from concurrent import futures

    stack = []

    def start(cut_after: int, hog_s: float = 0.0) -> tuple[str, _CuttingProxy]:
        srv = Server(ServerConfig(listen=[f"unix://{tmp_path}/server.sock"], max_streams=1))
        stack.append(lambda: srv.stop(0))
        proxy = _CuttingProxy(srv.targets[0], cut_after, hog_s)
        stack.append(proxy.close)
        front = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=MESSAGE_OPTIONS)
        pb_grpc.add_InputServiceServicer_to_server(proxy, front)
        front.add_insecure_port(f"unix://{tmp_path}/proxy.sock")
        front.start()
        stack.append(lambda: front.stop(0))
        return f"unix://{tmp_path}/proxy.sock", proxy

    yield start
    for stop in reversed(stack):
        stop()


def test_stream_ended_without_its_end_marker_is_resumed_not_taken_as_the_end(proxied,
                                                                             make_spec):
    spec = make_spec(order={"epochs": 2})
    target, _ = proxied(cut_after=3)
    with InputClient(target) as client, client.batches(spec, reconnect_deadline_s=30) as it:
        got = [batch_bytes(b) for b in it]
        assert it.reconnects == 1  # (a reopen may meet the cut stream's slot not yet free)
    assert_stream_equal(got, reference(spec))  # the whole stream: nothing lost or repeated


def test_full_server_while_reconnecting_is_retried_until_a_slot_frees(proxied, make_spec):
    # Endless, so the other stream holds its slot (a finite one could finish in the window).
    spec = make_spec(order={"epochs": 0})
    target, proxy = proxied(cut_after=3, hog_s=1.0)
    with InputClient(target) as client, client.batches(spec, reconnect_deadline_s=30) as it:
        got = [batch_bytes(next(it)) for _ in range(100)]
        assert it.reconnects == 1
        assert it.longest_stall_s >= 0.5  # it waited out the other stream's slot
    assert proxy.refused >= 1  # the reconnect did meet a full server
    assert_stream_equal(got, reference_prefix(spec, len(got)))


def _health(target: str) -> int:
    with grpc.insecure_channel(target) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="input_server.v1.InputService"),
            timeout=5).status


def _worker_processes(before: set[int]) -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
                    and "resource_tracker" not in " ".join(p.cmdline())):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _next_in_thread(it, timeout: float):
    """`next(it)` with a bound: returns the batch or the exception; fails the test on a hang."""
    result: list = []

    def run() -> None:
        try:
            result.append(next(it))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"next() still blocked after {timeout} s: a hang"
    return result[0]


def test_sigkilled_worker_process_ends_its_stream_naming_it(tmp_path, make_spec):
    """A dead worker ends its stream with INTERNAL naming it, not a hang and not a retry; the
    stream's other worker goes, other streams and health go on."""
    spec = make_spec(workers={"count": 2}, order={"epochs": 0})
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv, \
            InputClient(srv.targets[0]) as client:
        bystander = client.batches(make_spec(order={"epochs": 0}))
        next(bystander)
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        it = client.batches(spec, reconnect_deadline_s=60)
        next(it)
        deadline = time.monotonic() + 20
        while len(workers := _worker_processes(before)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(workers) == 2
        time.sleep(1.5)  # a stalled trainer: every buffer fills, the workers block writing
        victim = workers[0]
        victim.send_signal(signal.SIGKILL)
        start = time.monotonic()
        error = None
        while error is None and time.monotonic() - start < 30:
            result = _next_in_thread(it, timeout=30)
            if isinstance(result, BaseException):
                error = result
        assert isinstance(error, StreamError), error
        assert time.monotonic() - start < 15
        assert error.code == grpc.StatusCode.INTERNAL
        assert f"(pid {victim.pid})" in error.details and "of 2" in error.details
        assert "died with exit code -9 (killed by SIGKILL)" in error.details
        assert "Traceback" not in error.details
        assert it.reconnects == 0  # a dead worker is not the network: not retried
        # The stream's other worker goes too; the other stream and health carry on.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
                p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers):
            time.sleep(0.2)
        assert not [p.pid for p in workers
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for _ in range(20):
            next(bystander)
        assert _health(srv.targets[0]) == health_pb2.HealthCheckResponse.SERVING
        bystander.close()


def test_orbax_checkpoint_holds_the_iterator_state_beside_the_model(server, make_spec, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    import numpy as np

    from input_client.checkpoint import InputStateRestore, InputStateSave

    spec = make_spec()
    want = reference(spec)
    model = {"w": np.arange(6.0).reshape(2, 3), "b": np.zeros(3, np.float32)}
    client = InputClient(server.targets[0])
    with client.batches(spec, prefetch=4) as it:
        head = [batch_bytes(next(it)) for _ in range(7)]
        time.sleep(0.2)  # prefetched batches are not part of the state
        with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
            mngr.save(7, args=ocp.args.Composite(model=ocp.args.StandardSave(model),
                                                  data=InputStateSave(it)))
            mngr.wait_until_finished()
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        step = mngr.latest_step()
        restored = mngr.restore(step, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(model), data=InputStateRestore()))
    assert step == 7
    np.testing.assert_array_equal(restored.model["w"], model["w"])
    assert restored.data["seq"] == 7
    with client, client.batches(spec, state=restored.data) as it:
        tail = [batch_bytes(b) for b in it]
    assert_stream_equal(head + tail, want)


def test_chaos_script_kills_server_and_trainer_without_loss_or_duplicates(tmp_path):
    out = tmp_path / "chaos.json"
    run = subprocess.run([sys.executable, CHAOS, "--kills", "2", "--restarts", "1",
                          "--batches", "60", "--seed", "3", "--json", str(out)],
                         capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["server_kills"] == 2 and result["kills_survived"] == 2
    assert result["reconnects"] == 2  # each kill broke the trainer's stream
    assert result["trainer_restarts"] == 1
    assert result["batches_delivered"] >= 60
    assert result["batches_lost"] == 0 and result["batches_duplicated"] == 0
    assert result["identical_to_reference"]
