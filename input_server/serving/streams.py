"""The server's streams: admission (stream slots, handler threads), ids, and what `info` lists."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from input_client.proto import pb
from input_server.errors import CancelledError, RefusedError, status_of
from input_server.serving import warm
from input_server.serving.accounting import ServerTotals
from input_server.serving.slots import Slot
from input_server.serving.stream import Shared, Stream

log = logging.getLogger("input_server.serving.stream")

# How often a stream that waits for Grain's load behind a server that has just started looks
# whether its client left or the server drains.
LOAD_POLL_S = 0.1


def _code_of(e: BaseException) -> str:
    """The status a stream that raised `e` ends with, by name ("CANCELLED": the client left)."""
    if isinstance(e, GeneratorExit):
        return "CANCELLED"
    return status_of(e)[0].name


def _wait_for_grain(context: grpc.ServicerContext, draining: threading.Event) -> None:
    """Until Grain's load behind a server that has just started has ended (`warm.load_behind`);
    a stream admitted meanwhile holds its slot and handler thread, counted as every stream's."""
    while not warm.wait_loaded(LOAD_POLL_S):
        if draining.is_set():
            raise RefusedError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down.")
        if not context.is_active():
            raise CancelledError("the client left while the server loaded Grain.")


class Streams:
    """Admits, numbers and lists a server's streams; each stream owns the rest (`Stream`).

    Args:
      shared: what the streams share (the worker process pool among it).
      max_streams: concurrent streams; one more gets RESOURCE_EXHAUSTED at once, never a wait.
    """

    def __init__(self, shared: Shared, *, max_streams: int):
        self.shared = shared
        self._slots = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams
        self._ids = itertools.count(1)
        self._open: dict[int, Stream] = {}  # from admission to the end of its close
        self._handlers = 0  # StreamBatches calls from their start to their very end
        # Streams whose client left free their slot at once but keep a thread while their
        # set-up or teardown finishes: at most `max_handlers` in all, so that health and info
        # always find one of the server's threads.
        self.max_handlers = 2 * max_streams + 2
        self._lock = threading.Lock()
        self.totals = ServerTotals()  # every stream's figures, ended ones kept

    @contextlib.contextmanager
    def admit(
        self,
        request: pb.StreamBatchesRequest,
        requests: Iterator[Any],
        context: grpc.ServicerContext,
    ) -> Iterator[Stream]:
        """The stream of a StreamBatches call, set up (`Stream.open`), closed on leaving.

        Raises:
          RefusedError: RESOURCE_EXHAUSTED, the server runs its maximum of streams, or still
            closes those of clients that left.
          InputServerError: the stream's set-up refused the request.
        """
        with self._lock:
            busy = self._handlers >= self.max_handlers
            if not busy:
                self._handlers += 1
        if busy:
            raise RefusedError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the server is still closing streams of clients that left; retry shortly.",
            )
        try:
            slot = Slot(self._slots)
            if not slot.take():
                raise RefusedError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the server already runs its maximum of {self._max_streams} streams.",
                )
            try:
                _wait_for_grain(context, self.shared.draining)
                stream = Stream(
                    next(self._ids), request, requests, context, self.shared, on_leave=slot.give
                )
            except BaseException:
                slot.give()
                raise
            with self._lock:  # listed by info from its first moment
                self._open[stream.id] = stream
            self.totals.opened()
            code = "OK"
            try:
                stream.open()
                yield stream
                if stream.left:  # its messages stopped as the client left: not a clean end
                    code = "CANCELLED"
            except BaseException as e:
                code = _code_of(e)
                raise
            finally:
                slot.give()  # at once: the teardown goes on in this thread
                stream.close()
                self._ended(stream, code)
        finally:
            with self._lock:
                self._handlers -= 1

    def _ended(self, stream: Stream, code: str) -> None:
        """Its figures kept in the totals, and its end logged, as it leaves the list."""
        info = None
        try:
            info = None if stream.setting_up else stream.info()
        except Exception:  # its figures are lost, not its place in the list
            log.exception("stream %d: its last figures could not be read", stream.id)
        with self._lock:
            self._open.pop(stream.id, None)
            self.totals.ended(info, code)
        log.info(
            "stream %d ended: %s after %d batches",
            stream.id,
            code,
            info.batches_sent if info else 0,
            extra={
                "event": "stream_end",
                "fields": {
                    "stream": stream.id,
                    "code": code,
                    "batches": info.batches_sent if info else 0,
                },
            },
        )

    def drain(self) -> None:
        """Ends every stream now with UNAVAILABLE (the server's `draining` is set)."""
        with self._lock:
            streams = list(self._open.values())
        for stream in streams:
            stream.drain()

    def active_requests(self) -> int:
        """Streams being set up, running or closing."""
        with self._lock:
            return self._handlers

    def info(self) -> tuple[list[pb.StreamInfo], pb.ServerTotals]:
        """Each stream's info (those setting up first, then those that run, by id) and the
        totals over every stream, these included."""
        with self._lock:
            streams = sorted(self._open.values(), key=lambda s: (not s.setting_up, s.id))
        infos = [s.info() for s in streams]
        # A stream that ended meanwhile is in the totals already: count each once.
        with self._lock:
            running = [i for s, i in zip(streams, infos, strict=True) if s.id in self._open]
            return infos, self.totals.read([i for i in running if i.HasField("stats")])
