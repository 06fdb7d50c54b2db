"""A WSGI server for a small page (the metrics page) bounded like the gRPC listeners: a cap on
connections (more are closed at once), a deadline for a request's head and for silence, and a
fixed pool of threads started up front.

One thread waits on every socket (`selectors`) and reads each request's head into memory;
only a complete head reaches a worker, which runs wsgiref's handler and the application on
it. A peer that opens connections and sends nothing, or half a request (slowloris), holds a
place in the cap for a few seconds and never a thread: before, each such connection started
a thread that waited on it forever (1,100 of them took a server to its 1,024 threads).

A `gate` sees each complete head on the loop's thread before any worker does, and may answer
it at once with bytes of its own (the metrics page's 429 to a peer over its rate): no
handler, no application, no worker's turn.
"""

from __future__ import annotations

import errno
import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

log = logging.getLogger(__name__)

# Connections open at once (heads being read, and requests served). A Prometheus scrape is
# one connection at a time per scraper, and a pod has one or two scrapers: 32 leaves room for
# many, and is 32 descriptors of a server's 1,024 or more (its gRPC listeners take a quarter).
MAX_CONNECTIONS = 32
# Workers that serve complete requests. A scrape reads the server's figures in memory
# (milliseconds); two let one slow scrape not hold up the next. With the loop's thread the
# page never costs the server more than 3 threads, whatever its peers do.
THREADS = 2
# A connection with no byte for this long is closed. A scraper sends its whole request as it
# connects; the health port closes its silent connections after 1 s.
IDLE_S = 2.0
# A request's head must be complete this long after the connection opened, however its bytes
# trickle in (a byte every second passes `IDLE_S` forever); a response must be taken within
# it too (the page is a few KiB, which the kernel's buffer takes at once).
HEAD_S = 5.0
# A longer head is not a scrape (a Prometheus request's is about 300 bytes).
MAX_HEAD_BYTES = 16 << 10
# Descriptors exhausted (EMFILE): the listening socket stays readable, so accepting stops for
# this long rather than spinning the loop; nothing is queued but the kernel's backlog.
ACCEPT_PAUSE_S = 0.1
# Refused connections are logged at most this often, with their count.
LOG_EVERY_S = 60.0
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

# What a gate is given (the peer's address, the requests read on the connection: pipelined
# ones count each, though only the first is answered) and returns (None to serve the request,
# or the whole response to send instead).
Gate = Callable[[tuple, int], bytes | None]


def _requests(data: bytes) -> int:
    """Complete request heads in `data` (each ends with an empty line, CRLF or bare LF)."""
    return max(1, data.count(b"\n\r\n") + data.count(b"\n\n"))


class _Head:
    """A connection whose request's head is being read."""

    __slots__ = ("address", "data", "opened", "last")

    def __init__(self, address, now: float):
        self.address, self.data, self.opened, self.last = address, b"", now, now

    def deadline(self, idle_s: float, head_s: float) -> float:
        return min(self.last + idle_s, self.opened + head_s)


class _Handler(WSGIRequestHandler):
    """wsgiref's handler on a head already read: its request line and headers come from
    memory, its response goes to the socket. The page reads no body."""

    def __init__(self, request, client_address, server, head: bytes):
        self._head = head
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(self._head)

    def log_message(self, format, *args):  # a line a scrape would flood the log
        pass


class BoundedWSGIServer(WSGIServer):
    """A WSGI server on `address` (bound and listening at construction); `serve_forever()`
    runs its loop on the calling thread until `shutdown()`, `server_close()` releases all.

    Args:
      address: (host, port) for `family`.
      family: the socket family (AF_INET or AF_INET6).
      max_connections, threads, idle_s, head_s: the bounds (defaults above, with why).
      gate: called on the loop's thread with each complete head's peer and request count; a
        response it returns is sent in place of the application's (see `Gate`).
    """

    # The kernel's backlog: a burst of connections waits there (no thread, no descriptor)
    # until the loop accepts them, and closes those past the cap. At 64, a server whose loop
    # waited on the GIL behind a stream's threads dropped SYNs, each a 1 s retransmit for its
    # peer (a scraper among them): 1,100 connections took 14 s to open.
    request_queue_size = 1024

    def __init__(
        self,
        address,
        *,
        family: int = socket.AF_INET,
        max_connections: int = MAX_CONNECTIONS,
        threads: int = THREADS,
        idle_s: float = IDLE_S,
        head_s: float = HEAD_S,
        gate: Gate | None = None,
    ):
        self.address_family = family
        self.gate = gate
        self.max_connections, self.idle_s, self.head_s = max_connections, idle_s, head_s
        self.refused = 0  # connections closed at once, the cap full
        self._open = 0  # connections counted against the cap: read by the loop, lowered by workers
        self._lock = threading.Lock()
        self._logged_at, self._logged = -LOG_EVERY_S, 0
        self._stop = threading.Event()
        self._done = threading.Event()
        self._done.set()  # no loop running yet
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        # Never full: complete heads are fewer than the cap, and each worker's stop is one more.
        self._work: queue.Queue = queue.Queue(maxsize=max_connections + threads)
        self._workers = [
            threading.Thread(target=self._serve_requests, name=f"metrics-{i}", daemon=True)
            for i in range(threads)
        ]
        super().__init__(address, _Handler)  # binds and listens (closes all if it cannot)
        self.socket.setblocking(False)
        # Started now, all of them: the budget is fixed, and a server short of threads later
        # (RLIMIT_NPROC) still has the page's.
        for t in self._workers:
            t.start()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accepts, reads heads and hands complete ones to the workers until `shutdown()`."""
        self._done.clear()
        selector = selectors.DefaultSelector()
        selector.register(self.socket, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        heads: dict[socket.socket, _Head] = {}
        resume_at = None  # when accepting resumes after EMFILE
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                due = [h.deadline(self.idle_s, self.head_s) for h in heads.values()]
                due += [resume_at] if resume_at is not None else []
                wait = max(0.0, min([now + poll_interval, *due]) - now)
                for key, _ in selector.select(wait):
                    if key.fileobj is self.socket:
                        if self._accept(selector, heads):
                            selector.unregister(self.socket)
                            resume_at = time.monotonic() + ACCEPT_PAUSE_S
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    else:
                        self._read(selector, key.fileobj, heads)
                now = time.monotonic()
                if resume_at is not None and now >= resume_at:
                    selector.register(self.socket, selectors.EVENT_READ)
                    resume_at = None
                for sock, head in list(heads.items()):
                    if now >= head.deadline(self.idle_s, self.head_s):
                        self._drop(selector, sock, heads)
        finally:
            for sock in list(heads):
                self._drop(selector, sock, heads)
            selector.close()
            self._done.set()

    def _accept(self, selector, heads: dict) -> bool:
        """Accepts what waits in the backlog: up to the cap a head to read, past it closed at
        once. Returns whether descriptors ran out (accepting pauses)."""
        while True:
            try:
                sock, address = self.socket.accept()
            except BlockingIOError:
                return False
            except OSError as e:
                if e.errno in _OUT_OF_DESCRIPTORS:
                    return True
                continue  # ECONNABORTED and the like: that peer left
            with self._lock:
                full = self._open >= self.max_connections
                if not full:
                    self._open += 1
            if full:
                sock.close()
                self._count_refused()
                continue
            sock.setblocking(False)
            heads[sock] = _Head(address, time.monotonic())
            selector.register(sock, selectors.EVENT_READ)

    def _read(self, selector, sock: socket.socket, heads: dict) -> None:
        head = heads[sock]
        try:
            chunk = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the peer closed, or reset
            self._drop(selector, sock, heads)
            return
        start = max(0, len(head.data) - 2)
        head.data += chunk
        head.last = time.monotonic()
        # A head ends with an empty line; http.client, which parses it, takes bare LFs too.
        ended = head.data.find(b"\n\r\n", start) >= 0 or head.data.find(b"\n\n", start) >= 0
        if ended:
            selector.unregister(sock)
            del heads[sock]
            answer = self.gate(head.address, _requests(head.data)) if self.gate else None
            if answer is not None:
                self._answer_now(sock, answer)
                return
            sock.setblocking(True)
            sock.settimeout(self.head_s)  # for the response: a peer that reads none
            self._work.put_nowait((sock, head.address, head.data))
        elif len(head.data) > MAX_HEAD_BYTES:
            self._drop(selector, sock, heads)

    def _answer_now(self, sock: socket.socket, answer: bytes) -> None:
        """Sends a gate's answer and closes: a small one fits the socket's empty send buffer,
        so the loop never waits on the peer; a peer that reset loses it, its own loss."""
        try:
            sock.send(answer)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()
        self._release()

    def _drop(self, selector, sock: socket.socket, heads: dict) -> None:
        selector.unregister(sock)
        del heads[sock]
        sock.close()
        self._release()

    def _release(self) -> None:
        with self._lock:
            self._open -= 1

    def _count_refused(self) -> None:
        self.refused += 1
        self._logged += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning(
                "metrics page: %d connections closed at once, %d already open (the cap); "
                "keep the port reachable only by the scrapers",
                self._logged,
                self.max_connections,
            )
            self._logged_at, self._logged = now, 0

    def _serve_requests(self) -> None:
        while (item := self._work.get()) is not None:
            sock, address, head = item
            try:
                _Handler(sock, address, self, head)
            except Exception as e:  # a peer that left mid-response, a timeout: its own loss
                log.debug("metrics request from %s: %s", address, e)
            finally:
                self.shutdown_request(sock)
                self._release()

    def shutdown(self) -> None:
        """Stops `serve_forever` and waits for it to return; safe when it is not running."""
        self._stop.set()
        self._wake_w.send(b"x")
        self._done.wait()

    def server_close(self) -> None:
        """Releases the port and ends the workers (each after the request it serves)."""
        super().server_close()
        if self._closed:
            return
        self._closed = True
        for t in self._workers:
            if t.is_alive():
                self._work.put(None)
        for t in self._workers:
            if t.is_alive():
                t.join(self.head_s + 1)
        self._wake_r.close()
        self._wake_w.close()
