"""A peer for the metrics-port and health tests, run inside the test's network namespace:

metrics_peer.py halfopen HOST PORT CONNECTIONS SECONDS
    CONNECTIONS TCP connections that each send `GET /metrics HTTP/1.1\\r\\n` and nothing
    more, held for SECONDS. Prints {"opened": N} once they are open; then closes them and
    scrapes the page until it answers, and prints {"opened", "closed_by_server",
    "recovered_s"} (the seconds from closing them to the first page, None if it never came
    within 30 s).
metrics_peer.py watch HOST PORT SECONDS INTERVAL_S
    Kubelet-style probes of the health port (a new channel each, health Check, 1 s
    timeout), one every INTERVAL_S, each printed as it comes: {"t": seconds since the
    start, "status": "SERVING" | "NOT_SERVING" | the gRPC code name}.
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import time
import urllib.request

HALF = b"GET /metrics HTTP/1.1\r\n"


def _print(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def scrape(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
            return r.status == 200 and b"input_server_build_info" in r.read()
    except OSError:
        return False


def _closed(s: socket.socket) -> bool:
    """Whether the server closed `s` (EOF or a reset); it never sends anything else."""
    try:
        return s.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def halfopen(host: str, port: int, count: int, seconds: float) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (count + 256, max(count + 256, 4096)))
    held = []
    for _ in range(count):
        s = socket.create_connection((host, port), timeout=5)
        try:
            s.sendall(HALF)
        except OSError:
            pass  # already closed: counted below
        held.append(s)
    _print({"opened": len(held)})
    time.sleep(seconds)
    closed = sum(_closed(s) for s in held)
    for s in held:
        s.close()
    started, recovered = time.monotonic(), None
    while time.monotonic() - started < 30:
        if scrape(host, port):
            recovered = round(time.monotonic() - started, 2)
            break
        time.sleep(0.1)
    _print({"opened": len(held), "closed_by_server": closed, "recovered_s": recovered})


def watch(host: str, port: int, seconds: float, interval_s: float) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t = time.monotonic()
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            try:
                r = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.RpcError as e:
                status = e.code().name
        _print({"t": round(t - started, 2), "status": status})
        time.sleep(max(0.0, interval_s - (time.monotonic() - t)))


if __name__ == "__main__":
    mode, host, port, n, x = sys.argv[1:6]
    if mode == "halfopen":
        halfopen(host, int(port), int(n), float(x))
    else:
        watch(host, int(port), float(n), float(x))
