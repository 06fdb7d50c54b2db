"""The fuzz run's HTTP/2 flood: a peer without credentials opening health calls that send HEADERS
and nothing more (or HEADERS then RST_STREAM), as fast as it can, over FLOOD_CONNECTIONS raw
connections to the server's Unix socket (gRPC speaks h2c there, as on `--health-port`).

Issue 27 measured it on a namespace-bound health port: 0-1 of 37 one-second probes passed and
the server reached 5,778 threads (a thread a call, before any cap), or logged "can't start new
thread" 5,826 times under a pids limit. Findings: health or info slower than ANSWER_S during the
flood, the server past MAX_THREADS threads, no call of the flood refused (RST_STREAM or a
trailers-only answer: the server held every call it was sent), a traceback in the server's log.
The peer is `input_server.testing.http2_flood`'s `Flood` (the namespace test's), on the Unix
socket.
"""

from __future__ import annotations

import contextlib
import os
import random
import time

import grpc
import psutil
from fuzz_attacks import Finding, raw_stream, server_answers

from input_server.testing.http2_flood import Flood

FLOOD_CONNECTIONS, FLOOD_S = 4, 3.0
# The main listener's threads are bounded by its pool (84 with 8 streams: handlers, every
# method's caps, spares) and the first-request readers' cap (64), over some 80 of its own: a
# thread a call, as before the readers' cap, was 5,778 in 14 s. (Issue 27's 200 was the whole
# process under a flood of the health port, whose server is 2 streams a connection.)
MAX_THREADS = 400
HEALTH_CHECK = b"/grpc.health.v1.Health/Check"


def _log_size(log: str | None) -> int:
    try:
        return os.path.getsize(log) if log else 0
    except OSError:
        return 0


def _stream_starts(channel: grpc.Channel, first: bytes) -> tuple[str, str]:
    """A valid stream's first batch, as a trainer starting now would ask: (status, details)."""
    try:
        next(iter(raw_stream(channel)(iter([first]), timeout=10)))
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def flood(channel, target: str, first: bytes, rst: bool, pid: int | None, log: str | None):
    """FLOOD_S seconds of flood, health, info and a new stream asked meanwhile: findings, and
    what it sent and got."""
    label = f"{FLOOD_CONNECTIONS} connections of HEADERS-only calls" + (" + RST" if rst else "")
    found: list[Finding] = []
    start_log, most, before = _log_size(log), 0, None
    if pid:
        with contextlib.suppress(psutil.Error):
            before = psutil.Process(pid).num_threads()
    until = time.monotonic() + FLOOD_S
    path = target.removeprefix("unix://")
    peers = [Flood(path, until, rst, HEALTH_CHECK) for _ in range(FLOOD_CONNECTIONS)]
    for p in peers:
        p.start()
    time.sleep(0.5)  # the flood under way before the first answer is timed
    status, message = _stream_starts(channel, first)
    if status != "OK":
        found.append(("stream refused during a flood", label, status, message[:300]))
    while time.monotonic() < until:
        asked = time.monotonic()
        found += server_answers(channel, target, f"during {label}")
        if pid:
            with contextlib.suppress(psutil.Error):
                most = max(most, psutil.Process(pid).num_threads())
        time.sleep(max(0.0, 0.5 - (time.monotonic() - asked)))
    for p in peers:
        p.join(10)
    calls, answered = sum(p.calls for p in peers), sum(p.answered for p in peers)
    if most >= MAX_THREADS:
        found.append(("threads under a flood", label, "", f"{most} threads"))
    if calls and not answered and not rst:
        found.append(("flood never refused", label, "", f"{calls} calls, none answered"))
    if log:
        time.sleep(0.5)
        with open(log, "rb") as f:
            f.seek(start_log)
            new = f.read().decode(errors="replace")
        if "Traceback" in new or "can't start new thread" in new:
            found.append(("traceback in the server's log", label, "", new[-300:]))
    found += server_answers(channel, target, f"after {label}")
    figures = {"calls": calls, "answered": answered, "threads_before": before, "threads": most}
    return found, figures


def run_flood(channel, target, first, add, *, seed: int, pid: int | None, log: str | None) -> dict:
    """Two floods, HEADERS-only and with RST_STREAM, in the order the seed draws; each finding
    to `add`. `first` is a valid stream's first request."""
    start, figures = time.monotonic(), {}
    for rst in random.Random(seed).sample([False, True], 2):
        found, figures["rst" if rst else "headers_only"] = flood(
            channel, target, first, rst, pid, log
        )
        for finding in found:
            add(*finding)
    return {"http2_flood": round(time.monotonic() - start, 1), "http2_flood_figures": figures}
