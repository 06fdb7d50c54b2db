"""`StepTally`: running sums over the timed steps of one name, all a `StepTimer` summary needs of
them, so the timer keeps sums instead of records and its memory stays flat however long the
run."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

from input_client.running_sums import summed
from input_client.step_histogram import bucket
from input_client.step_record import StepRecord


@dataclasses.dataclass
class StepTally:
    """Running sums over the records of one step name (one tally a name: names are meant to be
    few, not one a step).

    Attributes:
      steps: records added.
      step_s, data_wait_s, wall_s: their seconds, summed.
      tokens: tokens of the records whose count is known, and those records' device, step +
        data wait and real seconds: each rate is these tokens over one of these times, never
        a mean of the steps' own rates (a mean of rates weighs a fast step like a slow one,
        so an uneven loop read far above what it processed).
      tflops, tflops_step_s: the TFLOP a device did in the records whose FLOP count is known,
        and those records' device seconds.
      buckets: a histogram of their step times: how many each `step_histogram.bucket` holds.
    """

    steps: int = 0
    step_s: float = 0.0
    data_wait_s: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    tokens_step_s: float = 0.0
    tokens_busy_s: float = 0.0
    tokens_wall_s: float = 0.0
    tflops: float = 0.0
    tflops_step_s: float = 0.0
    buckets: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)

    def add(self, r: StepRecord) -> None:
        """Counts one more record in."""
        self.steps += 1
        self.step_s += r.step_s
        self.data_wait_s += r.data_wait_s
        self.wall_s += r.wall_s
        if r.tflops_per_device is not None:
            # The record keeps the step's rate; times its device time, the work it did.
            self.tflops += r.tflops_per_device * r.step_s
            self.tflops_step_s += r.step_s
        if r.num_tokens is not None:
            self.tokens += r.num_tokens
            self.tokens_step_s += r.step_s
            self.tokens_busy_s += r.step_s + r.data_wait_s
            self.tokens_wall_s += r.wall_s
        self.buckets[bucket(r.step_s)] += 1

    @classmethod
    def merged(cls, tallies: Iterable[StepTally]) -> StepTally:
        """One tally of the records of several names."""
        return summed(cls, tallies)

    def figures(self) -> dict[str, Any]:
        """The summary's figures over the records added (`StepTimer.summary` says what each
        is); None where no record was added or the inputs are unknown."""
        busy = self.step_s + self.data_wait_s

        def rate(work: float, seconds: float) -> float | None:
            # No seconds: no step with a known count (or none that took time).
            return work / seconds if seconds > 0 else None

        return {
            "total_step_s": self.step_s,
            "total_data_wait_s": self.data_wait_s,
            "total_wall_s": self.wall_s,
            # Never below 0: a `data_wait_s` given by hand may exceed the real time.
            "total_other_s": max(0.0, self.wall_s - busy),
            "input_bound_fraction": self.data_wait_s / busy if busy > 0 else None,
            "device_tokens_per_s": rate(self.tokens, self.tokens_step_s),
            "tflops_per_device": rate(self.tflops, self.tflops_step_s),
            "step_and_wait_tokens_per_s": rate(self.tokens, self.tokens_busy_s),
            "wall_tokens_per_s": rate(self.tokens, self.tokens_wall_s),
        }
