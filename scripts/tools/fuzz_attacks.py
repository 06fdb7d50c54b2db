"""The fuzz run's aimed attacks: each one request (or a few calls) that once denied service.

Bad credit reports on a held-open stream, calls that never send their request, one request of
many globs over a big folder, a decompression bomb. Each attack says what the server must keep
doing meanwhile (answer health and `GetInfo` within ANSWER_S, end the attacker's call with a
contract status within its deadline) and returns its findings as (kind, request, status,
message).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import grpc

from input_client.proto import pb

STREAM = "/input_server.v1.InputService/StreamBatches"
INFO = "/input_server.v1.InputService/GetInfo"
# What the issue that found them measured: 24 silent calls starved a pool of 20 threads.
SILENT_CALLS = 24
# A folder of this many entries, and a request naming globs over it this many times.
FOLDER_ENTRIES, GLOB_COPIES, DISTINCT_GLOBS = 5_000, 10_000, 200
# Health and info answer within this while an attack runs. Starved, they took the whole 5 s
# deadline; served, they take milliseconds (0.015 s at most beside 24 silent calls:
# docs/benchmarks.md), and a host loaded by other work has stretched that past a second.
ANSWER_S = 2.5

Finding = tuple[str, str, str, str]


def raw_stream(channel: grpc.Channel):
    return channel.stream_stream(
        STREAM, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


def server_answers(channel: grpc.Channel, target: str, what: str) -> list[Finding]:
    """Health and GetInfo, each timed: a finding for each that takes over ANSWER_S."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    found = []
    for name, ask in [
        (
            "health",
            lambda: health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            ),
        ),
        (
            "info",
            lambda: channel.unary_unary(INFO)(pb.GetInfoRequest().SerializeToString(), timeout=5),
        ),
    ]:
        start = time.monotonic()
        try:
            ask()
        except grpc.RpcError as e:
            found.append((f"{name} failed", what, e.code().name, e.details() or ""))
            continue
        if (took := time.monotonic() - start) > ANSWER_S:
            found.append((f"{name} slow", what, "OK", f"{took:.2f} s"))
    return found


def credit_reports(channel: grpc.Channel, target: str, first: bytes, deadline_s: float):
    """Held-open streams whose credit reports break the contract: each must end with
    INVALID_ARGUMENT while everyone else is answered."""
    found: list[Finding] = []
    for label, report in [
        ("batches_taken 2^63", pb.StreamBatchesRequest(batches_taken=2**63).SerializeToString()),
        (
            "batches_taken 2^64-1",
            pb.StreamBatchesRequest(batches_taken=2**64 - 1).SerializeToString(),
        ),
        ("garbage report", b"\xff\xff\xff\xffnot a message"),
    ]:
        release = threading.Event()

        def requests(report=report, release=release):
            yield first
            yield report
            release.wait(deadline_s + 5)

        call = raw_stream(channel)(requests(), timeout=deadline_s + 5)
        status, message = "OK", ""
        try:
            for _ in call:
                pass
        except grpc.RpcError as e:
            status, message = e.code().name, e.details() or ""
        found += server_answers(channel, target, f"after a stream with {label}")
        release.set()
        if status != "INVALID_ARGUMENT":
            found.append(("credit report accepted", label, status, message))
    return found


def silent_calls(channel: grpc.Channel, target: str, first: bytes, deadline_s: float):
    """SILENT_CALLS streams and as many GetInfo calls that never send their request: health,
    info and a real stream still answer; the silent calls end on their own."""
    found: list[Finding] = []
    release = threading.Event()
    ended: list[str] = []

    def silent():
        release.wait(60)
        yield from ()

    def run(call) -> None:
        try:
            for _ in call:
                pass
            ended.append("OK")
        except grpc.RpcError as e:
            ended.append(e.code().name)

    threads = []
    for method in (STREAM, INFO):
        calls = channel.stream_stream(
            method, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        for _ in range(SILENT_CALLS):
            threads.append(threading.Thread(target=run, args=(calls(silent()),), daemon=True))
            threads[-1].start()
    time.sleep(1.0)  # every silent call has reached the server
    found += server_answers(channel, target, f"with {2 * SILENT_CALLS} silent calls open")
    try:
        next(iter(raw_stream(channel)(iter([first]), timeout=deadline_s + 10)))
    except grpc.RpcError as e:
        found.append(("stream refused", "beside silent calls", e.code().name, e.details() or ""))
    for t in threads:
        t.join(timeout=30)  # the server ends them (its first-request deadline)
    release.set()
    if len(ended) < len(threads):
        found.append(("silent calls never ended", "", "", f"{len(threads) - len(ended)} open"))
    for code in set(ended) - {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}:
        found.append(("silent call status", "", code, ""))
    return found


def many_globs(
    channel: grpc.Channel,
    target: str,
    request: pb.StreamBatchesRequest,
    root: str,
    deadline_s: float,
):
    """One request of many globs over a big folder: a contract status within the deadline."""
    folder = os.path.join(root, "wide")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        for i in range(FOLDER_ENTRIES):
            open(os.path.join(folder, f"e{i}.txt"), "w").close()
    found: list[Finding] = []
    for label, paths in [
        (f"{GLOB_COPIES} copies of one glob", [f"{folder}/*.jsonl"] * GLOB_COPIES),
        (f"{DISTINCT_GLOBS} distinct globs", [f"{folder}/*{i}*" for i in range(DISTINCT_GLOBS)]),
    ]:
        req = pb.StreamBatchesRequest()
        req.CopyFrom(request)
        del req.spec.mixture[:]  # one source: the globs'
        del req.spec.source.paths[:]
        req.spec.source.paths.extend(paths)
        start = time.monotonic()
        try:
            next(iter(raw_stream(channel)(iter([req.SerializeToString()]), timeout=deadline_s)))
            status, message = "OK", ""
        except grpc.RpcError as e:
            status, message = e.code().name, e.details() or ""
        if status in ("INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED"):
            found.append(("many globs", label, status, message))
        found += server_answers(
            channel, target, f"after {label} ({time.monotonic() - start:.1f} s)"
        )
    return found


def bomb(
    channel: grpc.Channel,
    target: str,
    request: pb.StreamBatchesRequest,
    root: str,
    deadline_s: float,
    bomb_mb: int,
) -> list[Finding]:
    """A zstd file inside the roots that expands to `bomb_mb` MB, past the server's
    --max-decompressed-mb: RESOURCE_EXHAUSTED naming the file and the flag within the deadline,
    health and info answering meanwhile (issue 18: a 310 KB file of 3.4 GiB OOM-killed the
    server after ~18 s, and every other stream with it)."""
    import zstandard

    path = os.path.join(root, "bomb.jsonl.zst")
    if not os.path.exists(path):  # built streaming: 1 MB in memory, a few hundred KB on disk
        line = b'{"text": "' + b"all work and no play " * 48 + b'"}\n'
        chunk = line * ((1 << 20) // len(line))
        c = zstandard.ZstdCompressor(level=3).compressobj()
        with open(path + ".part", "wb") as f:
            for _ in range(bomb_mb):
                f.write(c.compress(chunk))
            f.write(c.flush())
        os.replace(path + ".part", path)
    req = pb.StreamBatchesRequest()
    req.CopyFrom(request)
    del req.spec.mixture[:]  # one source: the bomb
    del req.spec.source.paths[:]
    req.spec.source.paths.append(path)
    label = f"a {os.path.getsize(path) >> 10} KB zstd file expanding to {bomb_mb} MB"
    found: list[Finding] = []
    answers: list[Finding] = []
    done = threading.Event()

    def watch() -> None:  # while the server decompresses, everyone else is answered
        while not done.wait(0.5):
            answers.extend(server_answers(channel, target, f"during {label}"))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        next(iter(raw_stream(channel)(iter([req.SerializeToString()]), timeout=deadline_s)))
        status, message = "OK", ""
    except grpc.RpcError as e:
        status, message = e.code().name, e.details() or ""
    finally:
        done.set()
        watcher.join()
    if status != "RESOURCE_EXHAUSTED" or "bomb.jsonl.zst" not in message:
        found.append(("bomb", label, status, message))
    elif "--max-decompressed-mb" not in message:
        found.append(("bomb message names no flag", label, status, message))
    return found + answers + server_answers(channel, target, f"after {label}")


def run_attacks(
    channel: grpc.Channel,
    target: str,
    request: pb.StreamBatchesRequest,
    root: str,
    deadline_s: float,
    add: Callable[..., None],
    *,
    bomb_mb: int,
) -> dict:
    """Every attack in turn; each finding goes to `add(kind, request, status, message)`.
    Returns the seconds each took."""
    windowed = pb.StreamBatchesRequest()
    windowed.CopyFrom(request)
    windowed.window = 2
    windowed.spec.order.epochs = 0  # a stream that would run for ever unless ended
    first = windowed.SerializeToString()
    took = {}
    for name, attack in [
        ("credit_reports", lambda: credit_reports(channel, target, first, deadline_s)),
        ("silent_calls", lambda: silent_calls(channel, target, first, deadline_s)),
        ("many_globs", lambda: many_globs(channel, target, request, root, deadline_s)),
        ("bomb", lambda: bomb(channel, target, request, root, deadline_s, bomb_mb)),
    ]:
        start = time.monotonic()
        for finding in attack():
            add(*finding)
        took[name] = round(time.monotonic() - start, 1)
    return took
