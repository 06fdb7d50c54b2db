"""Measuring a live stream: what its parallelism could produce, while it serves a loop that may
take less.

A stream's production is bounded by its consumer (flow control), so the rate it runs at says
what the loop takes, not what the workers could make. What they could make follows from how
busy each part was while making it (the utilization law, as tf.data's autotuner models its
stages from their measured busy time): the parallel stage's groups each report their own wall
time, so its utilization is their busy time over `workers` x the window; the in-order part
(packing, the stream's per-batch work) is busy whenever the producer neither waits for a group
nor for room in the send queue. The busier part is the bottleneck, and the rate it allows is
the window's rate over its utilization. A stream that never waits for room (the loop takes all
it makes) is running at that rate outright; so is one whose loop waited for data (its client
reports the trainer's exposed wait) for at least `verdict.INPUT_BOUND_WAIT` of the window,
whatever room the producer waited for: the loop takes all that reaches it, and the room the
producer waited for was the server's own sending (on a host whose cores the client shares, one
process's GIL shared by packing and gRPC's sends), part of what this parallelism delivers.
"""

from __future__ import annotations

import dataclasses

from input_server.batching.meter import Sums, Totals
from input_server.serving.verdict import INPUT_BOUND_WAIT

# A window in which the producer waited for room less than this share of the time ran as fast
# as it could: the loop takes everything it makes.
FREE_RUNNING = 0.1
# Utilization below this is not trusted to scale a rate up (one window's jitter).
MIN_UTILIZATION = 0.05


@dataclasses.dataclass(frozen=True, kw_only=True)
class Window(Sums):
    """What a stream did over `seconds` at `workers` groups in flight: how much its meter's
    sums grew (`Sums`' fields)."""

    seconds: float
    workers: int
    # The trainer's exposed data wait over the window, as its client reported it; -1 when
    # its client does not say.
    loop_wait_s: float = -1.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def free_running(self) -> bool:
        """Whether the loop took all the stream made: the producer hardly ever waited for
        room, or the loop waited for data."""
        return (
            self.blocked_s < FREE_RUNNING * self.seconds
            or self.loop_wait_s >= INPUT_BOUND_WAIT * self.seconds
        )

    @property
    def parallel_busy(self) -> float:
        """The parallel stage's utilization: group time over what `workers` could give."""
        return min(1.0, self.group_s / max(1e-9, self.workers * self.seconds))

    @property
    def serial_busy(self) -> float:
        """The in-order part's utilization: the producer's time neither waiting for a group
        nor for room."""
        idle = self.waiting_s + self.blocked_s
        return min(1.0, max(0.0, self.seconds - idle) / max(1e-9, self.seconds))

    @property
    def bottleneck(self) -> str:
        return "parallel" if self.parallel_busy >= self.serial_busy else "serial"

    def capacity(self) -> float:
        """Batches per second this parallelism could produce: the window's rate when it ran
        free, else the rate scaled by the bottleneck's utilization."""
        if self.free_running:
            return self.batches_per_s
        busy = max(self.parallel_busy, self.serial_busy, MIN_UTILIZATION)
        return self.batches_per_s / busy

    def tokens_capacity(self) -> float:
        if self.batches == 0:
            return 0.0
        return self.capacity() * self.tokens / self.batches


def window(start: Totals, end: Totals, workers: int, loop_wait_s: float = -1.0) -> Window:
    """What the stream did between two readings of its meter, at `workers` groups in flight,
    while its trainer waited `loop_wait_s` for data (-1: not reported)."""
    return Window(
        seconds=end.at - start.at, workers=workers, loop_wait_s=loop_wait_s, **end.since(start)
    )
