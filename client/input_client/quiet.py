"""The loop's dispatch window: the client's background threads keep off the GIL right after
`next()` returns, while the training loop dispatches its step.

Taking a batch is what makes the client work: the credit report goes out, the server sends the
next batch, the fetch thread wakes to decode it (checks, segment ids, positions, targets; with
`sharding=`, the placement: a millisecond or more with the GIL). Left alone, that work lands
exactly while the loop, holding the same GIL, dispatches its step, and the step waits for it.
Held back by a few milliseconds, the same work runs while the device computes and the loop sits
in `block_until_ready`, GIL released (scripts/bench/bench_client_cost.py measures both; figures in
docs/benchmarks.md).

The window is a share of the loop's own interval between batches, at most `MOST_S`, none for a
loop faster than `LEAST_S / SHARE` a batch, and it is never held while the loop has no batch
queued (it then waits for this one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Aliases, so tests can put a fake clock in their place and check the windows exactly.
clock = time.perf_counter
sleep = time.sleep

# The longest hold: a step's dispatch (a jitted call of a pytree) takes well under this.
MOST_S = 0.003
# The hold's share of the loop's interval between batches: a fast loop is held back less.
SHARE = 0.1
# How fast the interval follows the loop (an exponential moving average's weight).
FOLLOW = 0.2
# No window shorter than this: a sleep costs its thread ~0.1 ms past what it asks here, which a
# loop taking a batch every few milliseconds would feel in throughput (its dispatch is short).
LEAST_S = 0.0005


class Quiet:
    """When the training loop last took a batch, and how long its dispatch may take."""

    def __init__(self):
        self._last = 0.0  # perf_counter() when the loop last took a batch; 0: never
        self._interval = 0.0  # the loop's usual interval between batches

    def taken(self) -> None:
        """The loop took a batch now (in `next()`: two clock reads and a little arithmetic)."""
        now = clock()
        if self._last:
            gap = now - self._last
            self._interval = (
                gap if not self._interval else self._interval + FOLLOW * (gap - self._interval)
            )
        self._last = now

    def window_s(self) -> float:
        """How long after a batch is taken the background threads keep off (0: not at all)."""
        window = min(MOST_S, SHARE * self._interval)
        return window if window >= LEAST_S else 0.0

    def hold(self, loop_has_a_batch: Callable[[], bool]) -> None:
        """Sleeps (the GIL released) until the window after the last taken batch has passed;
        at once when the loop has no batch queued, or never took one."""
        if not self._last:
            return
        left = self._last + self.window_s() - clock()
        if left > 0 and loop_has_a_batch():
            sleep(left)
