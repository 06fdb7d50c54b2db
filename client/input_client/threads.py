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
from typing import Generic, TypeVar

T = TypeVar("T")

_ITEM, _END, _ERROR, _WAKE = range(4)


class Prefetcher(Generic[T]):
    """Runs `produce(put)` on a named daemon thread, at most `depth` items ahead of `get()`.

    `produce` calls `put(item)` for each item; `put` waits for room and returns False once the
    prefetcher is stopped, and the producer should then return. When `produce` returns, `get()`
    raises StopIteration after the last item; when it raises, `get()` re-raises its exception
    after the items put before it.

    Items and room travel through two `queue.SimpleQueue`s (the room as `depth` tokens): a
    `get` of a queued item is two calls into C, where a `threading.Condition` takes a dozen
    Python-level lock steps. The client's `next()` runs it once a batch in the training
    process, whose dispatch waits for the GIL meanwhile. A waiting `put` or `get` blocks in
    C; neither wakes on a clock (a stream whose consumer is slow costs no wake-ups).

    Args:
      produce: the producer, called once on the thread.
      depth: the most items queued (the backpressure that bounds memory).
      name: the thread's name (shown by py-spy, faulthandler and thread dumps).
      on_put: called after each item, the end or the error is queued (e.g. to wake a consumer
        that watches several prefetchers: `ready()`).
    """

    def __init__(
        self,
        produce: Callable[[Callable[[T], bool]], None],
        *,
        depth: int,
        name: str,
        on_put: Callable[[], None] | None = None,
    ):
        if depth < 1:
            raise ValueError(f"`depth` must be at least 1, got {depth}.")
        self._produce = produce
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._room: queue.SimpleQueue = queue.SimpleQueue()  # one token a free place
        for _ in range(depth):
            self._room.put(None)
        self._stop = threading.Event()
        self._on_put = on_put
        self._exited = False  # the producer's thread is done (its end or error queued, or not)
        self._finished = False  # the end or the error was taken
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: T) -> bool:
        """Queues `item` (waiting for room); False, and not queued, once stopped."""
        return self._put((_ITEM, item))

    def _put(self, entry: tuple) -> bool:
        if self._stop.is_set():
            return False
        self._room.get()
        if self._stop.is_set():  # stop() or close() gave the token that woke it
            return False
        self._items.put(entry)
        if self._on_put is not None:
            self._on_put()
        return True

    def _run(self) -> None:
        try:
            try:
                self._produce(self.put)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, who re-raises it
                self._put((_ERROR, e))
            else:
                self._put((_END, None))
        finally:
            self._exited = True
            self._items.put((_WAKE, None))  # a waiting get() looks again

    def queued(self) -> int:
        """Items waiting to be taken now (at most `depth`; a wake-up note may count too)."""
        return self._items.qsize()

    def ready(self) -> bool:
        """Whether `get()` would return (or raise) at once: an item, the end or the error is
        queued, or the producer is gone."""
        return not self._items.empty() or self._finished or self._exited

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
            if (self._stop.is_set() or self._exited) and self._items.empty():
                self._finished = True
                raise StopIteration
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            kind, value = self._items.get(timeout=left)  # raises queue.Empty
            if kind != _WAKE:
                break
        self._room.put(None)  # room for a waiting put
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
        """Tells the producer to stop: its waiting `put` returns False at once."""
        self._stop.set()
        self._room.put(None)  # wakes a put waiting for room, which then sees the stop
        self._items.put((_WAKE, None))  # and a get waiting for an item

    def close(self, timeout: float | None = 10.0) -> None:
        """Stops the producer, frees what it queued, and waits up to `timeout` for it to end."""
        self.stop()
        self._drain()
        self._thread.join(timeout)
        self._drain()  # what it put while we waited
        self._items.put((_WAKE, None))  # for a get that waits still

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _drain(self) -> None:
        while True:
            try:
                self._items.get_nowait()
            except queue.Empty:
                return
            self._room.put(None)
