"""What a server shares among its streams: stream slots and worker processes."""

from __future__ import annotations

import threading
import time

import grpc

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
