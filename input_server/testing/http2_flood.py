"""A peer without credentials, for the listener tests (run inside the test's network namespace):

    http2_flood.py flood HOST PORT CONNECTIONS SECONDS [rst] [/METHOD/PATH]
        CONNECTIONS raw HTTP/2 connections opening calls (default health Check) that send
        HEADERS and nothing more (with `rst`, each followed by RST_STREAM), as fast as they can, for
        SECONDS; reconnecting when the server closes one. Prints {"calls": N} at the end.
    http2_flood.py idle HOST PORT CONNECTIONS SECONDS
        CONNECTIONS TCP connections that send nothing, held for SECONDS. Prints
        {"opened": N} once they are open, then {"opened", "refused", "still_held"}.
    http2_flood.py probe HOST PORT COUNT INTERVAL_S
        COUNT kubelet-style probes (a new channel each, health Check, 1 s timeout), one
        every INTERVAL_S. Prints {"passed": N, "failed": N, "marks": ".x..", "errors": [...]}
        (marks: each probe in order, "." passed).

Raw sockets: the frames are the few a hostile peer needs (RFC 9113 framing, RFC 7541 literal
header fields), so no HTTP/2 library is needed.
"""

from __future__ import annotations

import json
import resource
import socket
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS, PING = 1, 3, 4, 6
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 8


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
    return head + struct.pack(">I", stream) + payload


def _literal(index: int, value: bytes) -> bytes:
    """A header field without indexing, its name from the static table (index < 15)."""
    return bytes([index]) + bytes([len(value)]) + value


def call_headers(path: bytes) -> bytes:
    """HPACK for a gRPC call's headers: :method POST, :scheme http, :path, :authority,
    content-type application/grpc, te: trailers."""
    return (
        b"\x83\x86"
        + _literal(4, path)
        + _literal(1, b"probe")
        + b"\x0f\x10"  # content-type: static index 31
        + bytes([len(b"application/grpc")])
        + b"application/grpc"
        + b"\x00\x02te\x08trailers"
    )


class Flood(threading.Thread):
    """One connection's calls, reopened when the server closes it. `address` is (host, port)
    or a Unix socket's path. Counts the calls sent and those the server answered (RST_STREAM,
    or HEADERS ending the stream: a call refused or ended)."""

    def __init__(self, address: tuple[str, int] | str, until: float, rst: bool, path: bytes):
        super().__init__(daemon=True)
        self.address, self.until, self.rst, self.path = address, until, rst, path
        self.calls = self.answered = 0

    def _connect(self) -> socket.socket:
        if not isinstance(self.address, str):
            return socket.create_connection(self.address, timeout=5)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(5)
            s.connect(self.address)
        except OSError:
            s.close()
            raise
        return s

    def _read(self, s: socket.socket) -> None:
        """Answers the server's SETTINGS and PINGs (a peer that did not would be cut off for
        it, not for its calls); counts its answers to calls; drops the rest."""
        buf = b""
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    return
                buf += data
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    kind, flags, payload = buf[3], buf[4], buf[9 : 9 + n]
                    buf = buf[9 + n :]
                    if kind == SETTINGS and not flags & ACK:
                        s.sendall(frame(SETTINGS, ACK, 0))
                    elif kind == PING and not flags & ACK:
                        s.sendall(frame(PING, ACK, 0, payload))
                    elif kind == RST_STREAM or (kind == HEADERS and flags & END_STREAM):
                        self.answered += 1
        except OSError:
            return

    def run(self) -> None:
        block = call_headers(self.path)
        while time.monotonic() < self.until:
            try:
                s = self._connect()
            except OSError:
                time.sleep(0.05)
                continue
            threading.Thread(target=self._read, args=(s,), daemon=True).start()
            try:
                s.sendall(PREFACE + frame(SETTINGS, 0, 0))
                stream = 1
                while time.monotonic() < self.until and stream < 2**31 - 200:
                    out = []
                    for _ in range(50):
                        out.append(frame(HEADERS, END_HEADERS, stream, block))
                        if self.rst:
                            out.append(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
                        stream += 2
                    s.sendall(b"".join(out))
                    self.calls += 50
                    time.sleep(0.001)  # let the reader answer a PING between bursts
            except OSError:
                pass
            finally:
                s.close()


def flood(host: str, port: int, connections: int, seconds: float, rst: bool, path: str) -> dict:
    until = time.monotonic() + seconds
    threads = [Flood((host, port), until, rst, path.encode()) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 10)
    return {"calls": sum(t.calls for t in threads)}


def idle(host: str, port: int, connections: int, seconds: float) -> dict:
    """Opens `connections` sockets that send nothing and holds them for `seconds`; counts
    those the server still held at the end."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (connections + 256, connections + 256))
    held, refused = [], 0
    for _ in range(connections):
        try:
            held.append(socket.create_connection((host, port), timeout=2))
        except OSError:
            refused += 1
    print(json.dumps({"opened": len(held)}), flush=True)
    time.sleep(seconds)
    still = sum(_open(s) for s in held)
    return {"opened": len(held), "refused": refused, "still_held": still}


def _open(s: socket.socket) -> bool:
    """Whether the server still holds `s` (one it closed reads as EOF at once)."""
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def probe(host: str, port: int, count: int, interval_s: float) -> dict:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    passed, errors, marks = 0, [], ""
    for _ in range(count):
        start = time.monotonic()
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            try:
                r = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
                ok = r.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError as e:
                ok = False
                errors.append(f"{e.code().name}: {e.details()}")
            passed += ok
            marks += "." if ok else "x"
        time.sleep(max(0.0, interval_s - (time.monotonic() - start)))
    return {"passed": passed, "failed": count - passed, "marks": marks, "errors": errors[:5]}


def main(argv: list[str]) -> None:
    mode, host, port, n, x = argv[:5]
    if mode == "flood":
        rest = argv[5:]
        path = next((a for a in rest if a.startswith("/")), "/grpc.health.v1.Health/Check")
        out = flood(host, int(port), int(n), float(x), rst="rst" in rest, path=path)
    elif mode == "idle":
        out = idle(host, int(port), int(n), float(x))
    else:
        out = probe(host, int(port), int(n), float(x))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
