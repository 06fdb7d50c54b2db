"""The pod's data wait in MaxText: each train step's worst host (the JAX process that waited
longest for its batch) gathered from every process, and the run's data-loading badput.

MaxText 0.2.5 calls `MetricLogger.record_train_metrics` on every process right after
dispatching each train step, and writes that step's metrics (`write_metrics`) one call of
`buffer_and_write_metrics` later, after the next step's dispatch, or at the end of training
(`flush_metrics_and_cleanup`). So the gather of a step's waits is dispatched when the step is
recorded (every process, the same steps in the same order: the gather is a collective) and read
when it is written, a step later: on an accelerator the host does not wait for it.
"""

from __future__ import annotations

import os
from typing import Any

from input_client import badput as badput_records
from input_client.badput import BadputTally, RunBadput
from input_client.pod import PodGather, PodStep
from input_client.step_record import new_run_id

# Each gathered step's worst host, in MaxText's metrics beside `perf/data_wait_seconds`.
WORST_SCALAR = "perf/worst_data_wait_seconds"
WORST_PROCESS_SCALAR = "perf/worst_data_wait_process"
# Steps between the badput lines a run appends (and one at its end): a run killed midway
# loses at most this many steps of its figure.
BADPUT_EVERY = 10


class PodWait:
    """One run's gathered steps: each step's worst host, and the badput they add up to.

    On one JAX process nothing is gathered: the process is its own worst host, and its badput
    is its own waits.
    """

    def __init__(self, badput_path: str | os.PathLike[str] | None = None):
        """Args:
        badput_path: a file the run's `RunBadput` line is appended to every `BADPUT_EVERY`
          steps and at the end of training (by process 0 only); None: none is written.
        """
        self.badput_path = os.fspath(badput_path) if badput_path is not None else None
        self.run_id = new_run_id()
        self._gather: PodGather | None = None
        self._processes: int | None = None  # known at the first step (jax imported then)
        self._process_index = 0
        self._recorded = 0  # steps recorded: the index each process gives the same step
        self._pending_step: int | None = None  # MaxText's step whose gather is in flight
        self._gathered: dict[int, PodStep] = {}  # collected, not yet written
        self._tally = BadputTally()

    @property
    def processes(self) -> int:
        return self._processes or 1

    def record(self, step: int, waited: float, step_time_s: float) -> None:
        """This process's wait for `step`'s batch and MaxText's step time (the wait included),
        sent to every process; on one process, kept as the step's worst."""
        if self._processes is None:
            import jax

            self._processes, self._process_index = jax.process_count(), jax.process_index()
            if self._processes > 1:
                self._gather = PodGather(1)  # compiled at the first step, MaxText's compile
        step_s = max(0.0, step_time_s - waited)  # the step's own time, as StepTimer's
        if self._gather is None:
            self._gathered[step] = PodStep(self._recorded, "train", (waited,), (step_s,))
        else:
            if self._gather.pending:  # the previous step not written yet: MaxText out of turn
                self._collect()
            self._gather.submit(self._recorded, [waited], [step_s])
            self._pending_step = step
        self._recorded += 1

    def worst(self, step: int) -> PodStep | None:
        """`step`'s figures from every process, counted into the badput (once; None for a step
        not recorded)."""
        if self._gather is not None and self._pending_step == step:
            self._collect()
        gathered = self._gathered.pop(step, None)
        if gathered is not None:
            self._count(gathered)
        return gathered

    def _collect(self) -> None:
        [(index, waits, times)] = self._gather.collect()
        self._gathered[self._pending_step] = PodStep(index, "train", waits, times)
        self._pending_step = None

    def _count(self, step: PodStep) -> None:
        self._tally.add(step.worst_data_wait_s, step.worst_process)
        if self._tally.steps % BADPUT_EVERY == 0:
            self.write_badput()

    def badput(self) -> RunBadput:
        """The run's data-loading badput over the steps written so far."""
        return self._tally.figure(self.run_id, self.processes)

    def write_badput(self) -> None:
        """Appends the badput line (process 0, with a `badput_path`, after a step)."""
        if self.badput_path is not None and self._tally.steps and not self._process_index:
            badput_records.append(self.badput_path, self.badput())

    def words(self, step: PodStep) -> str:
        """The log's words for a gathered step's worst host (none on one process)."""
        if self.processes < 2:
            return ""
        return f", worst host: process {step.worst_process} waited {step.worst_data_wait_s:.3f} s"

    def add_scalars(self, scalars: dict[str, Any], step: PodStep) -> None:
        """The worst host's wait and index among MaxText's step scalars (several processes)."""
        if self.processes > 1:
            scalars[WORST_SCALAR] = step.worst_data_wait_s
            scalars[WORST_PROCESS_SCALAR] = float(step.worst_process)
