"""Peers without credentials at the plaintext `--health-port` (which binds every interface, so
the server runs in a network namespace of the test's own, never on the host's interfaces):
four raw HTTP/2 connections opening health calls that send HEADERS alone (or HEADERS then
RST_STREAM) as fast as they can leave kubelet-style probes passing and the server's threads
bounded, and so do token-less StreamBatches calls and health calls themselves on a main TCP
port (each connection holds few first-request readers, `call_limits.CONNECTION_READERS`: 12 of
37 probes passed before); 1,100 sockets that send nothing, under a descriptor limit of 1,024,
leave health answering on both listeners. The peer is `input_server/testing/http2_flood.py`,
raw sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.support import ROOT, ChildProcess, health
from tests.support.netns import Hosts, hosts_or_skip, serve_in

# 1 s probes must pass under a flood: a measure of time, run alone.
pytestmark = pytest.mark.alone

PORT = 50052
PEER = str(ROOT / "input_server" / "testing" / "http2_flood.py")


@pytest.fixture(scope="module")
def host():
    with hosts_or_skip(1, f"hf{os.getpid() % 100000}") as h:
        yield h


def _serve(host: Hosts, tmp_path, *prefix: str, tcp: bool = False) -> tuple[ChildProcess, str]:
    """`serve` in the namespace, a Unix socket and the health port (with `tcp`, loopback TCP
    on PORT + 1 too, without a token): the process, the socket."""
    target = f"unix://{tmp_path}/s.sock"
    more = ["--listen", f"127.0.0.1:{PORT + 1}", "--insecure-tcp"] if tcp else []
    child = serve_in(
        host, 0, "--listen", target, *more, "--health-port", str(PORT),
        log=str(tmp_path / "serve.log"), prefix=prefix, ready="health",
    )  # fmt: skip
    return child, target


def _peer(host: Hosts, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        host.argv(
            0,
            [
                sys.executable,
                PEER,
                *args,
            ],
        ),
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
    )


def _result(p: subprocess.Popen, timeout: float) -> dict:
    out, _ = p.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


@pytest.mark.parametrize(
    "reset, port, method",
    [
        (False, PORT, ""),
        (True, PORT, ""),
        # On the main port, token-less calls of another method: health keeps its readers.
        (False, PORT + 1, "/input_server.v1.InputService/StreamBatches"),
        # On the main port, health calls themselves: each connection holds few readers.
        (False, PORT + 1, "/grpc.health.v1.Health/Check"),
    ],
    ids=["headers-only", "headers-then-rst", "main-port-streams", "main-port-health"],
)
def test_a_flood_of_calls_leaves_probes_passing_and_threads_bounded(
    host, tmp_path, reset, port, method
):
    server, _ = _serve(host, tmp_path, tcp=port != PORT)
    flood = None
    try:
        address = host.addresses[0] if port == PORT else "127.0.0.1"
        rst = ["rst"] if reset else []
        flood = _peer(
            host, "flood", address, str(port), "4", "10", *rst, *([method] if method else [])
        )
        time.sleep(2.0)  # the flood under way before the first probe
        probes = _peer(host, "probe", address, str(port), "25", "0.25")
        most, stop = 0, threading.Event()

        def sample() -> None:
            nonlocal most
            while not stop.wait(0.2):
                most = max(most, _threads(server.p.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = _result(probes, 60)
        stop.set()
        sampler.join()
        calls = _result(flood, 60)["calls"]
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        server.kill()
    assert calls > 10_000, "the flood never got going"
    # What a kubelet acts on: failureThreshold probes in a row failed (3 by default, which the
    # readiness probes in deploy/k8s keep) take the pod out of service. A probe alone may miss
    # its 1 s on a loaded host: beside a CPU burner 1 or 2 of 25 did (timed out, or waited
    # past `call_limits.GRACE_S` for its reader and was counted silent), never 2 in a row. The
    # flood turned most of them away (12 of 37 passed).
    assert "xxx" not in result["marks"] and result["passed"] >= 20, result  # of 25
    assert most < 200, f"the server reached {most} threads under the flood"


def test_idle_connections_under_a_descriptor_limit_leave_health_answering(host, tmp_path):
    server, target = _serve(host, tmp_path, "prlimit", "--nofile=1024:1024")
    idle = None
    try:
        idle = _peer(host, "idle", host.addresses[0], str(PORT), "1100", "12")
        assert json.loads(idle.stdout.readline())["opened"] == 1100
        probes = _peer(host, "probe", host.addresses[0], str(PORT), "20", "0.4")
        slow = []
        for _ in range(5):  # the main listener takes new connections meanwhile
            started = time.monotonic()
            assert health(target) == 1  # SERVING
            slow += [time.monotonic() - started] if time.monotonic() - started > 2.0 else []
            time.sleep(0.5)
        descriptors = len(os.listdir(f"/proc/{server.p.pid}/fd"))
        result = _result(probes, 60)
        held = _result(idle, 60)
    finally:
        if idle is not None and idle.poll() is None:
            idle.kill()
        server.kill()
    assert not slow, f"health on the Unix socket took {slow} s"
    assert descriptors < 512, f"the server held {descriptors} descriptors"
    # Probes the idle sockets' first second turned away (the cap full) may fail; then all pass.
    assert result["passed"] >= 17 and "x" not in result["marks"][5:], result
    assert held["still_held"] <= 16, held
