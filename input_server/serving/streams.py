"""The server's streams: admission (stream slots, handler threads), ids, and what `info` lists."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from input_client.proto import pb
from input_server.errors import RefusedError
from input_server.serving.slots import Slot
from input_server.serving.stream import Shared, Stream


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
                stream = Stream(
                    next(self._ids), request, requests, context, self.shared, on_leave=slot.give
                )
            except BaseException:
                slot.give()
                raise
            with self._lock:  # listed by info from its first moment
                self._open[stream.id] = stream
            try:
                stream.open()
                yield stream
            finally:
                slot.give()  # at once: the teardown goes on in this thread
                stream.close()
                with self._lock:
                    self._open.pop(stream.id, None)
        finally:
            with self._lock:
                self._handlers -= 1

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

    def info(self) -> list[pb.StreamInfo]:
        """Each stream's info: those setting up first, then those that run, by id."""
        with self._lock:
            streams = sorted(self._open.values(), key=lambda s: (not s.setting_up, s.id))
        return [s.info() for s in streams]
