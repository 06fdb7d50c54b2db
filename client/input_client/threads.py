"""One bounded prefetcher: a producer on a named daemon thread, a bounded queue, a stop event.

Grain's prefetch thread has this shape, and so does every producer here: the client's fetch
thread, the server's per-stream producer and the autotuner's measuring run. The producer's
exception is re-raised to the consumer; `stop()` unblocks a producer waiting for room.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_ITEM, _END, _ERROR = range(3)


def put_unless_stopped(
    q: queue.Queue, item: Any, stop: threading.Event, poll_s: float = 0.1
) -> bool:
    """Puts `item`, waiting for room; returns False, without putting it, once `stop` is set.

    A producer blocked on a full queue must still notice that its consumer is gone, so it
    waits in short slices rather than forever.
    """
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False


class Prefetcher(Generic[T]):
    """Runs `produce(put)` on a named daemon thread, at most `depth` items ahead of `get()`.

    `produce` calls `put(item)` for each item; `put` waits for room and returns False once the
    prefetcher is stopped, and the producer should then return. When `produce` returns, `get()`
    raises StopIteration after the last item; when it raises, `get()` re-raises its exception
    after the items put before it.

    Args:
      produce: the producer, called once on the thread.
      depth: the most items queued (the backpressure that bounds memory).
      name: the thread's name (shown by py-spy, faulthandler and thread dumps).
      poll_s: how often a waiting `put` looks at the stop event.
      on_put: called after each item, the end or the error is queued (e.g. to wake a consumer
        that watches several prefetchers: `ready()`).
    """

    def __init__(
        self,
        produce: Callable[[Callable[[T], bool]], None],
        *,
        depth: int,
        name: str,
        poll_s: float = 0.1,
        on_put: Callable[[], None] | None = None,
    ):
        if depth < 1:
            raise ValueError(f"`depth` must be at least 1, got {depth}.")
        self._produce = produce
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._on_put = on_put
        self._finished = False  # the end or the error was taken
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: T) -> bool:
        """Queues `item` (waiting for room); False, and not queued, once stopped."""
        return self._put((_ITEM, item))

    def _put(self, entry: tuple) -> bool:
        queued = put_unless_stopped(self._queue, entry, self._stop, self._poll_s)
        if queued and self._on_put is not None:
            self._on_put()
        return queued

    def _run(self) -> None:
        try:
            self._produce(self.put)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, who re-raises it
            self._put((_ERROR, e))
        else:
            self._put((_END, None))

    def ready(self) -> bool:
        """Whether `get()` would return (or raise) at once: an item, the end or the error is
        queued, or the producer is gone."""
        return not self._queue.empty() or self._finished or not self._thread.is_alive()

    def get(self, timeout: float | None = None) -> T:
        """The next item.

        Raises:
          queue.Empty: nothing came within `timeout` seconds.
          StopIteration: the producer returned (or the prefetcher was stopped) and every item
            it put was taken.
          Exception: the producer's, after the items it put before raising.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._finished:
                raise StopIteration
            wait = (
                self._poll_s if deadline is None else min(self._poll_s, deadline - time.monotonic())
            )
            try:
                kind, value = self._queue.get(timeout=max(0.0, wait))
                break
            except queue.Empty:
                if self._stop.is_set() or not self._thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise StopIteration from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise
        if kind == _ITEM:
            return value
        self._finished = True
        if kind == _ERROR:
            raise value
        raise StopIteration

    def is_alive(self) -> bool:
        """Whether the producer is still running."""
        return self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def wait_stopped(self, timeout: float) -> bool:
        """Waits up to `timeout` for `stop()`; whether it came."""
        return self._stop.wait(timeout)

    def stop(self) -> None:
        """Tells the producer to stop; its waiting `put` returns False within `poll_s`."""
        self._stop.set()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stops the producer, frees what it queued, and waits up to `timeout` for it to end."""
        self.stop()
        self._drain()
        self._thread.join(timeout)
        self._drain()  # what it put while we waited

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
