"""A request's set-up work paced so that it cannot starve the streams already running.

Reading a resharded state (`batching.resharded`) costs CPU that a client chooses: up to about
0.8 s for the largest state the bounds admit, and any client may send it from many
calls at once. In one server process that work competes for the interpreter with every
running stream's packing and sending, so 8 such calls at once took a running stream from 187
to 38 batches/s. Here each request's set-up runs free for a short grace (every honest state
of a few hundred old hosts reads within it), then waits its turn (one paced request at a
time, first come first served) and runs at a bounded share of one core, within a CPU budget
of its own checked before each unit of work.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

from input_server import cancel
from input_server.errors import OverBudgetError

# Module-level aliases: tests give the pacer other clocks.
thread_time = time.thread_time
sleep = time.sleep
WAIT_POLL_S = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class PaceConfig:
    """How set-up work beyond its grace is paced.

    Attributes:
      grace_s: CPU seconds a request's set-up takes before it is paced (4 old hosts' state
        reads in about 4 ms here, 64 hosts' of a 16-component mixture in about 20 ms); 8
        forged states at once take 8 graces unpaced.
      share: the fraction of wall time a paced request may compute (1/20: the largest state
        the bounds admit, 0.6 s of CPU, reads in 12 s, and a running stream keeps about 0.9
        of its rate; at 1/10 it kept 0.56-1.03 on this loaded 2-core host).
      slice_s: CPU a paced request computes between its pauses (a few ms: the interpreter's
        own switch interval is 5 ms).
      budget_s: the most CPU one request's set-up may take; checked before each unit of
        work (the largest state the bounds admit took 0.6-0.8 s here).
      max_waiting: requests that may wait for their turn; more are refused.
    """

    grace_s: float = 0.01
    share: float = 0.05
    slice_s: float = 0.005
    budget_s: float = 5.0
    max_waiting: int = 16

    def __post_init__(self):
        if not 0 < self.share <= 1:
            raise ValueError(f"`share` must be in (0, 1], got {self.share}.")
        if self.grace_s < 0 or self.slice_s <= 0 or self.budget_s <= 0:
            raise ValueError(
                f"`grace_s`, `slice_s` and `budget_s` must be positive, got {self.grace_s}, "
                f"{self.slice_s} and {self.budget_s}."
            )
        if self.max_waiting < 0:
            raise ValueError(f"`max_waiting` must be at least 0, got {self.max_waiting}.")


class Gate:
    """One paced request at a time, the others served in the order they came."""

    def __init__(self, config: PaceConfig = PaceConfig()):
        self.config = config
        self._cond = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._holder: object | None = None

    @contextlib.contextmanager
    def work(self, what: str) -> Iterator[Callable[[], None]]:
        """Within the block, call the function it gives between units of `what`'s work: it
        returns at once within the grace, then takes the request's turn and paces it.

        Raises (from that function):
          OverBudgetError: the request's set-up passed `budget_s` of CPU, or too many
            requests wait for their turn.
          CancelledError: the client left (`cancel.scope`).
        """
        pacer = _Pacer(self, what)
        try:
            yield pacer.pace
        finally:
            self._leave(pacer)

    def enter(self, pacer: _Pacer) -> None:
        """Makes `pacer` the one paced request, waiting its turn; refuses past `max_waiting`."""
        with self._cond:
            if self._holder is None and not self._queue:
                self._holder = pacer
                return
            if len(self._queue) >= self.config.max_waiting:
                raise OverBudgetError(
                    f"{pacer.what}: {len(self._queue)} requests already wait to set up large "
                    f"resumed states, the most the server queues ({self.config.max_waiting}); "
                    f"retry later."
                )
            self._queue.append(pacer)
            try:
                while self._holder is not None or self._queue[0] is not pacer:
                    # Woken when the holder leaves; else once a second, to see whether its
                    # client left (each wake-up takes the interpreter from the running
                    # streams: 8 waiters polling 10 times a second cost one 10 % of its rate).
                    self._cond.wait(WAIT_POLL_S)
                    cancel.check()  # a client that left gives its place up
            except BaseException:
                self._queue.remove(pacer)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            self._holder = pacer

    def _leave(self, pacer: _Pacer) -> None:
        with self._cond:
            if self._holder is pacer:
                self._holder = None
                self._cond.notify_all()


class _Pacer:
    """One request's set-up: its CPU so far, and whether it holds the gate."""

    def __init__(self, gate: Gate, what: str):
        self.gate, self.what = gate, what
        self.start = self.mark = thread_time()
        self.held = False

    def pace(self) -> None:
        cancel.check()
        config = self.gate.config
        now = thread_time()
        used = now - self.start
        if used > config.budget_s:
            raise OverBudgetError(
                f"{self.what} took over {config.budget_s:g} s of the server's CPU, the most a "
                f"request's set-up may take: resume on fewer old hosts' states."
            )
        if used < config.grace_s:
            return
        if not self.held:
            self.gate.enter(self)
            self.held = True
            self.mark = thread_time()
            return
        burst = now - self.mark
        if burst >= config.slice_s:
            sleep(burst * (1 / config.share - 1))
            self.mark = thread_time()


# The server's one gate: set-up work from every request shares it.
GATE = Gate()
