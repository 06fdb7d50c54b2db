"""What one call may hold of the server's threads: a bounded wait for its request, and few
calls of each method at once.

gRPC Python's sync server gives every call a thread of its pool before its request arrives,
and that thread waits for the request for as long as the call lives (a unary call's message,
a stream's first one). 24 `StreamBatches` calls that sent nothing held every thread, so
health, `GetInfo` and new streams timed out for as long as the calls stayed open. Here:
- every handler reads its first request on a helper thread, at most FIRST_MESSAGE_S;
- an honest call's request comes with its headers: one that has not come within GRACE_S
  waits under its method's cap on silent calls (`WAITING_CAP`), so silent calls never hold
  more threads than the caps, and do not keep honest calls of the same method out;
- once its request has come, a call of any method but StreamBatches (whose running streams
  the servicer caps) holds a place under its method's cap on calls at once (`ACTIVE_CAPS`; a
  health `Watch` holds its thread for as long as it watches);
- one call more than a cap allows is refused at once (RESOURCE_EXHAUSTED), so the pool
  (`threads`) always has a thread for a health check;
- the helper threads themselves are capped (`readers`), taken before one starts: a peer
  opening calls faster than they end (HEADERS alone, or HEADERS and RST_STREAM, thousands a
  second) made a thread per call, 5,778 of them, until the process could start no more;
- and each TCP connection holds few of them (`CONNECTION_READERS`): a reader ends only when
  gRPC's completion queue delivers its call's end, which a flood delays, so 4 connections of
  HEADERS-only health calls held all 26 health readers and turned away 25 of 37 probes made
  on connections of their own. Unix-socket peers all read `unix:` (`auth.py`): no connection
  to tell apart, so they share the global caps, waited for in turn (`READER_WAIT_S`).

A unary method becomes a request-streaming one on the server's side, which the wire does not
tell apart (a unary client sends its one message and half-closes).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

# An honest client sends its request with the call's headers: a second is already generous on
# a loaded host, and five leave room for a slow network.
FIRST_MESSAGE_S = 5.0
# How long a call waits for its request before it counts as silent.
GRACE_S = 0.1
# Silent calls of one method waiting at once.
WAITING_CAP = 4
STREAM_METHOD = "/input_server.v1.InputService/StreamBatches"
# Calls at once of each method other than StreamBatches (whose running streams the servicer
# caps), once their request has come. GetInfo and Check answer in a millisecond, so only a
# burst reaches their cap (every client's `batches()` asks GetInfo first: many trainers
# starting at once must not be refused); DescribeTokenizer loads a model, and Watch holds its
# thread for as long as it watches.
ACTIVE_CAPS = {
    "/input_server.v1.InputService/GetInfo": 16,
    "/input_server.v1.InputService/DescribeTokenizer": 4,
    "/grpc.health.v1.Health/Check": 16,
    "/grpc.health.v1.Health/Watch": 2,
}
# Any method not named above: reflection's one (ServerReflectionInfo, a stream of lookups, each
# answered at once), the single other method `threads` counts.
OTHER_CAP = 2
HEALTH = "/grpc.health.v1.Health/"
# Readers reserved for health calls: its methods' silent and active calls.
HEALTH_READERS = WAITING_CAP * 2 + sum(n for m, n in ACTIVE_CAPS.items() if m.startswith(HEALTH))
# Readers one TCP connection may hold at once, of health's and of the others'. An honest call
# holds one for the moment its request takes to arrive (it comes with the headers), so even a
# client starting several streams at once on one channel stays well within; a flooding
# connection holds these few, and 4 of them leave 10 of health's 26 free (7 take them all;
# then a probe waits its turn, `READER_WAIT_S`, as on a Unix socket).
CONNECTION_READERS = {"health": 4, "other": 12}
# How long a call waits for a reader when all are taken, before it is refused: readers come
# free as the calls holding them end, and the waiting calls take them in turn (a Condition
# wakes its waiters first come, first served), so a probe among a flood's calls is served
# instead of losing every race to them. Unix-socket peers cannot be told apart by connection
# (`CONNECTION_READERS`): there this queue is what lets health through. HEADERS-only health
# calls on 4 Unix connections: 4 of 26 checks passed, refused at once; with a wait of 2 s
# (and `server.CONNECTION_CALLS_PCT`), every one, the slowest in 1.4 s.
READER_WAIT_S = 2.0

_NOTHING = object()


class CallLimits(grpc.ServerInterceptor):
    """Reads each call's first request with a deadline, within caps on calls per method.

    Args:
      deadline_s: how long a call may take to send its first request.
      grace_s: how long a call may wait for it before it counts against `WAITING_CAP`.
    """

    def __init__(
        self,
        *,
        deadline_s: float = FIRST_MESSAGE_S,
        grace_s: float = GRACE_S,
        readers: int | None = None,
    ):
        self._deadline_s = deadline_s
        self._grace_s = grace_s
        # A reader ends with its call, but a call's end reaches it only through gRPC's
        # completion queue, which a flood delays: never more readers than the pool's threads.
        # Health has readers of its own: a flood of other calls (token-less StreamBatches on
        # a TLS port) must not take a probe's.
        self._readers = threading.BoundedSemaphore(readers or self.threads())
        self._health_readers = threading.BoundedSemaphore(HEALTH_READERS)
        self._connections = {k: _PerConnection(n) for k, n in CONNECTION_READERS.items()}
        self._caps: dict[tuple[str, str], threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()

    @staticmethod
    def threads() -> int:
        """The most pool threads that calls under these caps may hold, beyond running streams
        (the servicer's `max_handlers`): every method's silent calls and active ones."""
        methods = {STREAM_METHOD, *ACTIVE_CAPS}
        return WAITING_CAP * (len(methods) + 1) + sum(ACTIVE_CAPS.values()) + OTHER_CAP

    def _cap(self, kind: str, method: str) -> threading.BoundedSemaphore | None:
        if kind == "active" and method == STREAM_METHOD:
            return None
        with self._lock:
            s = self._caps.get((kind, method))
            if s is None:
                n = WAITING_CAP if kind == "waiting" else ACTIVE_CAPS.get(method, OTHER_CAP)
                s = self._caps[(kind, method)] = threading.BoundedSemaphore(n)
            return s

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        health_call = method.startswith(HEALTH)
        call = _Call(
            method,
            waiting=self._cap("waiting", method),
            active=self._cap("active", method),
            readers=self._health_readers if health_call else self._readers,
            connection=self._connections["health" if health_call else "other"],
            deadline_s=self._deadline_s,
            grace_s=self._grace_s,
        )
        h = handler
        if h.request_streaming and h.response_streaming:

            def behavior(requests, context):
                requests = call.chained(requests, context)
                with call.admitted(context):
                    yield from h.stream_stream(requests, context)

            return _replace(h, grpc.stream_stream_rpc_method_handler, behavior)
        if h.request_streaming:

            def behavior(requests, context):
                requests = call.chained(requests, context)
                with call.admitted(context):
                    return h.stream_unary(requests, context)

            return _replace(h, grpc.stream_unary_rpc_method_handler, behavior)
        if h.response_streaming:

            def behavior(requests, context):
                request = call.one(requests, context)
                with call.admitted(context):
                    yield from h.unary_stream(request, context)

            return _replace(h, grpc.stream_stream_rpc_method_handler, behavior)

        def behavior(requests, context):
            request = call.one(requests, context)
            with call.admitted(context):
                return h.unary_unary(request, context)

        return _replace(h, grpc.stream_unary_rpc_method_handler, behavior)


def _replace(handler, make: Callable, behavior: Callable) -> grpc.RpcMethodHandler:
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _take(cap: threading.BoundedSemaphore, context: grpc.ServicerContext, why: str) -> None:
    if not cap.acquire(blocking=False):
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{why}; retry shortly.")


class _PerConnection:
    """Places each TCP connection may hold, counted by `context.peer()` (`ipv4:IP:PORT`,
    `ipv6:[IP]:PORT`: one per connection). Other peers (`unix:`) are not counted."""

    def __init__(self, cap: int):
        self._cap = cap
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, peer: str) -> bool:
        if not peer.startswith(("ipv4:", "ipv6:")):
            return True
        with self._lock:
            n = self._held.get(peer, 0)
            if n >= self._cap:
                return False
            self._held[peer] = n + 1
            return True

    def release(self, peer: str) -> None:
        if not peer.startswith(("ipv4:", "ipv6:")):
            return
        with self._lock:
            n = self._held.pop(peer) - 1
            if n:
                self._held[peer] = n


class _Call:
    """One call: its first request, read within the deadline, and its place under its caps."""

    def __init__(
        self,
        method: str,
        *,
        waiting: threading.BoundedSemaphore,
        active: threading.BoundedSemaphore | None,
        readers: threading.BoundedSemaphore,
        connection: _PerConnection,
        deadline_s: float,
        grace_s: float,
    ):
        self._method = method
        self._waiting, self._active, self._readers = waiting, active, readers
        self._connection = connection
        self._deadline_s, self._grace_s = deadline_s, grace_s

    @contextlib.contextmanager
    def admitted(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Holds the call's place under its method's cap on calls at once, or refuses it."""
        if self._active is None:
            yield
            return
        _take(self._active, context, f"too many calls to {self._method} at once")
        try:
            yield
        finally:
            self._active.release()

    def _read(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """The first request, or _NOTHING when the client half-closed without one."""
        box: queue.Queue = queue.Queue(1)
        peer = context.peer()

        def release() -> None:
            self._readers.release()
            self._connection.release(peer)

        def read() -> None:
            # When the call ends without a request (it timed out here, or the client left),
            # gRPC ends this wait too: the thread never outlives the call.
            try:
                box.put((next(requests, _NOTHING), None))
            except Exception as e:  # noqa: BLE001 - the call ended while waiting
                box.put((_NOTHING, e))
            finally:
                release()

        # The reader's places are taken before its thread starts: past a cap, no thread. The
        # wait for a free reader holds this pool thread, as the server's backlog allows.
        if not self._connection.take(peer):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too many calls on this connection are waiting for their request; retry shortly.",
            )
        if not self._readers.acquire(timeout=READER_WAIT_S):
            self._connection.release(peer)
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too many calls are waiting for their request; retry shortly.",
            )
        try:
            threading.Thread(target=read, name="first-request", daemon=True).start()
        except RuntimeError:  # the process can start no more threads (a pids limit)
            release()
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the server cannot start a thread for this call now; retry shortly.",
            )
        try:
            request, error = box.get(timeout=self._grace_s)
        except queue.Empty:
            _take(self._waiting, context, f"too many calls to {self._method} send no request")
            try:
                request, error = box.get(timeout=max(0.0, self._deadline_s - self._grace_s))
            except queue.Empty:
                context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the call sent no request within {self._deadline_s:g} s of its start.",
                )
            finally:
                self._waiting.release()
        if error is not None or (request is _NOTHING and not context.is_active()):
            # Cancelled while waiting (gRPC may end the wait as if the client half-closed).
            context.abort(grpc.StatusCode.CANCELLED, "the call ended before its request.")
        return request

    def chained(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """The call's requests, the first one already read within the deadline."""
        request = self._read(requests, context)
        return requests if request is _NOTHING else itertools.chain((request,), requests)

    def one(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """A unary call's one request."""
        request = self._read(requests, context)
        if request is _NOTHING:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request.")
        return request
