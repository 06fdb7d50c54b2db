"""`StepRecord`: one timed step, and its line of JSON (what `StepTimer(records_path=...)` appends
and `input-server plot-steps` reads), tagged with the run it belongs to."""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from typing import Any

from input_client.pod import PodStep


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One timed step.

    Attributes:
      index: 0 for the first step the timer saw, then 1, 2, ...
      name: "compile" for the first step unless named, else the given name or "train".
      step_s: wall seconds from dispatching the step until its outputs were ready.
      data_wait_s: seconds the loop waited for this step's data (not part of `step_s`).
      wall_s: real seconds from the previous step's end to this step's end (for the first step,
        from the timer's creation): the step, its data wait and whatever else the loop did
        between them (logging, checkpoints, evaluation).
      num_tokens: tokens the step processed, if known.
      tokens_per_s: `num_tokens / step_s`, or None when the token count is unknown.
      tflops_per_device: `flops_per_step / step_s / num_devices / 1e12`, or None when the
        FLOP count is unknown.
    """

    index: int
    name: str
    step_s: float
    data_wait_s: float
    wall_s: float
    num_tokens: int | None
    tokens_per_s: float | None
    tflops_per_device: float | None


def new_run_id() -> str:
    """A run id that sorts by start time and tells apart runs started in the same second
    (several hosts, or a restart): `20261206T134928Z-3fa9c1`."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def json_line(
    run_id: str, record: StepRecord, pod: PodStep | None = None, process: int | None = None
) -> str:
    """One record as a line of JSON, its keys `run` and the record's fields (`input-server
    plot-steps` reads them; `run` tells apart the runs appended to one file); with the pod's
    view of the step, `process` (the writer's index), `worst_process`, `worst_data_wait_s`
    and `worst_step_s` (the worst host's wait and its own step time) too."""
    line: dict[str, Any] = {"run": run_id, **dataclasses.asdict(record)}
    if pod is not None:
        worst = pod.worst_process
        line["process"] = process
        line["worst_process"] = worst
        line["worst_data_wait_s"] = pod.data_wait_s[worst]
        line["worst_step_s"] = pod.step_s[worst]
    return json.dumps(line) + "\n"
