"""Data-loading badput: the seconds a job's chips waited for input, a JSON record per run and
their sum over a job's (re)starts."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

# The `record` of every line, so the file can sit among other JSON lines and be found.
RECORD = "data_loading_badput"


@dataclasses.dataclass(frozen=True)
class RunBadput:
    """What one run (one `StepTimer`, one start of the job) cost in waiting for input.

    A pod trains in lock step, so every chip waits as long as the slowest host: each step counts
    the worst host's data wait (one process: its own).

    Attributes:
      run: the timer's `run_id`.
      processes: JAX processes the figures cover.
      steps: steps counted so far (every step, named ones too: the chips waited all the same).
      first_batch_wait_s: the worst host's wait for the run's first batch: the pipeline's
        start-up after the (re)start.
      first_batch_process: the process that waited it (None before the first step).
      step_wait_s: the worst hosts' waits over every later step.
    """

    run: str
    processes: int
    steps: int
    first_batch_wait_s: float
    first_batch_process: int | None
    step_wait_s: float

    @property
    def badput_s(self) -> float:
        """The run's data-loading badput: its first batch's wait plus its steps' waits."""
        return self.first_batch_wait_s + self.step_wait_s

    def to_json(self) -> dict[str, Any]:
        """The record's line: `record`, `time` (Unix seconds when written), the attributes and
        `badput_s`."""
        return {
            "record": RECORD,
            "time": time.time(),
            **dataclasses.asdict(self),
            "badput_s": self.badput_s,
        }


@dataclasses.dataclass
class BadputTally:
    """A run's badput counted as its steps come, each by its worst host: running sums, so a
    figure asked every few steps costs the same at step 10 and at step 100,000."""

    steps: int = 0
    first_batch_wait_s: float = 0.0
    first_batch_process: int | None = None
    step_wait_s: float = 0.0

    def add(self, wait_s: float, process: int) -> None:
        """The next step's worst host: its data wait and process index."""
        if self.steps == 0:
            self.first_batch_wait_s, self.first_batch_process = wait_s, process
        else:
            self.step_wait_s += wait_s
        self.steps += 1

    def figure(self, run: str, processes: int) -> RunBadput:
        """The run's figure over the steps added so far."""
        return RunBadput(run=run, processes=processes, **dataclasses.asdict(self))


def append(path: str | os.PathLike[str], badput: RunBadput) -> None:
    """Appends the run's figures so far as one line: the last line of a run is its figure, so a
    run killed midway keeps what it had counted."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(badput.to_json()) + "\n")


def job_badput(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The job's data-loading badput from a file of `RunBadput` lines (other lines skipped): each
    run's last line, summed over the runs.

    Returns:
      A dict: `badput_s` (the job's figure), `first_batch_wait_s` (of it, the (re)starts' first
      batches), `step_wait_s` (the worst hosts' per-step waits), `restarts` (runs after the
      first) and `runs` (each run's last line, in the order runs first appear).

    Raises:
      OSError: the file cannot be read.
    """
    runs: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if (
                isinstance(record, dict)
                and record.get("record") == RECORD
                and all(k in record for k in ("run", "first_batch_wait_s", "step_wait_s"))
            ):  # a line cut short by a kill, or not ours, is passed over like one not JSON
                runs[record["run"]] = record
    last = list(runs.values())
    first = sum(r["first_batch_wait_s"] for r in last)
    steps = sum(r["step_wait_s"] for r in last)
    return {
        "badput_s": first + steps,
        "first_batch_wait_s": first,
        "step_wait_s": steps,
        "restarts": max(0, len(last) - 1),
        "runs": last,
    }
