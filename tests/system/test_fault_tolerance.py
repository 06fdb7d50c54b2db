"""Exactly once across SIGKILLs: of the server process (with its worker processes), of the
trainer, of one Grain worker; and scripts/tools/chaos.py, which does it all at random. Real
processes, real SIGKILLs, real sockets; every wait is bounded."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from input_client import InputClient, StreamError
from input_server.serving.server import Server, ServerConfig
from tests.support import (
    ChildProcess,
    ServerProcess,
    assert_same_batches,
    batch_bytes,
    free_port,
    health,
    run_pipeline,
    script,
    still_running,
    worker_processes,
    write_token_file,
)

CHAOS = script("tools/chaos.py")


@pytest.fixture
def server_process(tmp_path):
    """`server_process(transport)`: a started `ServerProcess` on a Unix socket or a TCP port;
    all are killed at the end."""
    started = []

    def make(transport: str) -> ServerProcess:
        token_file = None
        if transport == "unix":
            address = f"unix://{tmp_path}/input.sock"
        else:
            address = f"127.0.0.1:{free_port()}"  # the restarts reuse the port
            token_file, _ = write_token_file(tmp_path)  # TCP needs a token
        srv = ServerProcess(address, str(tmp_path / "server.log"), token_file)
        started.append(srv)
        srv.start()
        return srv

    yield make
    for srv in started:
        srv.kill()


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_server_sigkilled_at_random_batches_stream_continues_byte_identical(
    server_process, make_spec, transport
):
    """Three SIGKILLs (server and workers), each followed by a restart on the same address.

    gRPC's flow-control window lets the server run a few MB ahead of the caller, so a kill is
    only felt once the caller has used what already arrived: the next kill comes at a random
    count of batches after the stream broke and reconnected, so every kill is one the
    caller's stream really lost.
    """
    spec = make_spec(batch={"seq_len": 1024, "size": 8}, order={"epochs": 0})
    rng = random.Random(f"kills-{transport}")
    srv = server_process(transport)
    got: list = []
    kills_at: list[int] = []
    next_kill = rng.randrange(5, 30)
    with (
        InputClient(srv.address, connect_timeout_s=30, token_file=srv.token_file) as client,
        client.batches(spec, reconnect_deadline_s=30) as it,
    ):
        while True:
            got.append(next(it))
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
    assert_same_batches(got, run_pipeline(spec, limit=len(got)))


def test_trainer_sigkilled_restarts_from_saved_state_with_other_worker_counts(
    server, make_spec, tmp_path
):
    """The consuming process dies (SIGKILL) and restarts from its checkpoint (the iterator's
    JSON state beside the log it trained on); each restart also changes `workers.count`."""
    spec = make_spec()
    steps = 150
    paths = {k: str(tmp_path / k) for k in ("ckpt", "log", "spec.json", "trainer.log")}
    kill_at = [23, 61, 102]  # between checkpoints (every 5 steps): work since then is redone
    worker_counts = [0, 1, 0, 2]

    def trainer(incarnation: int) -> ChildProcess:
        with open(paths["spec.json"], "w") as f:
            json.dump(spec.replace(workers={"count": worker_counts[incarnation]}).to_dict(), f)
        return ChildProcess(
            [
                sys.executable,
                CHAOS,
                "trainer",
                "--target",
                server.targets[0],
                "--spec",
                paths["spec.json"],
                "--ckpt",
                paths["ckpt"],
                "--log",
                paths["log"],
                "--batches",
                str(steps),
                "--checkpoint-every",
                "5",
                # Steps take time, as in training: a trainer done before the test reads its lines
                # would leave no step to kill it at.
                "--step-ms",
                "20",
            ],
            log=paths["trainer.log"],
            read_lines=True,
        )

    incarnation = 0
    proc = trainer(incarnation)
    try:
        while True:
            line = proc.lines.get(timeout=60)
            assert line is not None, (
                f"trainer exited with {proc.p.wait()} before finishing: "
                + (tmp_path / "trainer.log").read_text()[-2000:]
            )
            if line == "done":
                break
            if line.startswith("batch ") and kill_at and int(line.split()[1]) >= kill_at[0]:
                kill_at.pop(0)
                proc.kill()  # SIGKILL
                incarnation += 1
                proc = trainer(incarnation)
        assert proc.p.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert incarnation == 3
    with open(paths["log"], "rb") as f:
        logged = f.read()
    want = run_pipeline(spec, limit=steps)
    size = len(batch_bytes(want[0].arrays))
    assert_same_batches([logged[i : i + size] for i in range(0, len(logged), size)], want)
    with open(paths["ckpt"]) as f:
        assert json.load(f)["state"]["seq"] == steps


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
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
    ):
        bystander = client.batches(make_spec(order={"epochs": 0}))
        next(bystander)
        before = {p.pid for p in worker_processes()}
        it = client.batches(spec, reconnect_deadline_s=60)
        next(it)
        deadline = time.monotonic() + 20
        while len(workers := worker_processes(exclude=before)) < 2 and time.monotonic() < deadline:
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
        while time.monotonic() < deadline and still_running(workers):
            time.sleep(0.2)
        assert not [p.pid for p in still_running(workers)]
        for _ in range(20):
            next(bystander)
        assert health(srv.targets[0]) == health_pb2.HealthCheckResponse.SERVING
        bystander.close()


def test_chaos_script_kills_server_and_trainer_without_loss_or_duplicates(tmp_path):
    out = tmp_path / "chaos.json"
    run = subprocess.run(
        [
            sys.executable,
            CHAOS,
            "--kills",
            "2",
            "--restarts",
            "1",
            "--batches",
            "60",
            "--seed",
            "3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
    )  # chaos.py runs from any folder
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["server_kills"] == 2 and result["kills_survived"] == 2
    assert result["reconnects"] == 2  # each kill broke the trainer's stream
    assert result["trainer_restarts"] == 1
    assert result["batches_delivered"] >= 60
    assert result["batches_lost"] == 0 and result["batches_duplicated"] == 0
    assert result["identical_to_reference"]
