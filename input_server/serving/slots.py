"""What a server shares among its streams, and each stream's hold on it: stream slots and worker
processes."""

from __future__ import annotations

import threading
import time

import grpc

from input_server.batching.budget import UNBOUNDED, StreamBudget
from input_server.errors import CancelledError, RefusedError

# How long a stream asking for fixed worker processes waits for them to free (a reconnecting
# client's old stream may still be closing its workers) before it is refused.
PROCESS_WAIT_S = 3.0


class Slot:
    """One stream's hold on a semaphore, given back once however many times `give` is called
    (the client leaving and the handler ending both give it)."""

    def __init__(self, semaphore: threading.Semaphore):
        self._semaphore = semaphore
        self._held = False
        self._lock = threading.Lock()

    def take(self) -> bool:
        self._held = self._semaphore.acquire(blocking=False)
        return self._held

    def give(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._semaphore.release()


class ProcessPool:
    """Worker processes across all streams of a server: at most `cap` at a time."""

    def __init__(self, cap: int):
        self.cap = cap
        self._free = cap
        self._cond = threading.Condition()

    def free(self) -> int:
        with self._cond:
            return self._free

    def take(self, n: int, *stop: threading.Event) -> None:
        """Takes `n` processes, waiting up to PROCESS_WAIT_S for them.

        Raises:
          RefusedError: RESOURCE_EXHAUSTED, other streams hold them.
          CancelledError: one of `stop` (the client left, the server drains) was set meanwhile.
        """
        deadline = time.monotonic() + PROCESS_WAIT_S
        with self._cond:
            while self._free < n:
                if any(e.is_set() for e in stop):
                    raise CancelledError("cancelled while waiting for worker processes.")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RefusedError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"`workers.count` {n}: only {self._free} of the server's --max-workers "
                        f"{self.cap} worker processes are free (other streams run the rest); "
                        f'retry later, ask for fewer, or use "auto".',
                    )
                self._cond.wait(min(0.1, remaining))
            self._free -= n

    def take_up_to(self, n: int) -> int:
        """Takes at most `n` processes, as many as are free, without waiting."""
        with self._cond:
            got = min(n, self._free)
            self._free -= got
            return got

    def give(self, n: int) -> None:
        if n:
            with self._cond:
                self._free += n
                self._cond.notify_all()


class ProcessReservation:
    """One stream's worker processes, reserved against the server's (`ProcessPool`): the
    stream opens with them, its live tuner (`retune.StreamTuner`) grows and shrinks them as it
    switches, and `close` gives back what is held, once. The one count of what the stream holds.

    An "auto" stream's are held to the copies of its document order its budget fits at once
    (`StreamBudget.processes_fit`): each worker process computes its own copy, which its
    tuning (measuring memory once the processes run) would learn of too late.

    Args:
      pool: the server's processes.
      budget: the stream's; the default bounds nothing (as many as are free).
    """

    def __init__(self, pool: ProcessPool, budget: StreamBudget = UNBOUNDED):
        self._pool = pool
        self._most = budget.processes_fit()
        self._held = 0
        self._lock = threading.Lock()  # the tuner's thread changes it, `close` another's
        self.cap = pool.cap  # the server's --max-workers, for messages

    @property
    def held(self) -> int:
        """The processes the stream holds now."""
        return self._held

    def _room(self, n: int) -> int:
        return n if self._most is None else max(0, min(n, self._most - self._held))

    def free(self) -> int:
        """What the stream may take now: the server's free processes, within `most`."""
        return self._room(self._pool.free())

    def take(self, n: int, *stop: threading.Event) -> None:
        """Takes a fixed count's `n` processes, waiting for them (`ProcessPool.take`, which
        says what it raises); `most` does not bound them: the order's budget counted their
        copies before the order was computed (`StreamBudget.order_budget`)."""
        self._pool.take(n, *stop)
        with self._lock:
            self._held += n

    def take_up_to(self, n: int) -> int:
        """Takes at most `n` processes, as many as are free to the stream, without waiting."""
        with self._lock:
            got = self._pool.take_up_to(self._room(n))
            self._held += got
            return got

    def grow_to(self, n: int) -> bool:
        """Holds `n` processes if that many are free to the stream (True), else takes none
        (False)."""
        with self._lock:
            more = n - self._held
            if more <= 0:
                return True
            got = self._pool.take_up_to(self._room(more))
            if got < more:
                self._pool.give(got)
                return False
            self._held += got
            return True

    def shrink_to(self, n: int) -> None:
        """Gives the server back what the stream holds beyond `n`."""
        with self._lock:
            if n < self._held:
                self._pool.give(self._held - n)
                self._held = n

    def close(self) -> None:
        """Gives the server back all the stream holds. Idempotent."""
        self.shrink_to(0)
