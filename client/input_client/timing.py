"""StepTimer: the device time of each JAX train step, with the time spent waiting for data apart."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

# An alias, so tests can put a fake clock in its place and check the arithmetic exactly.
perf_counter = time.perf_counter

T = TypeVar("T")

DEFAULT_EXCLUDE = ("compile",)


class WaitSource(Protocol):
    """Anything that counts the seconds a training loop spent blocked waiting for data.

    `input_client`'s batch iterator is one: its `wait_time_s` grows by the time each `next()`
    blocked.
    """

    wait_time_s: float


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One timed step.

    Attributes:
      index: 0 for the first step the timer saw, then 1, 2, ...
      name: "compile" for the first step unless named, else the given name or "train".
      step_s: wall seconds from dispatching the step until its outputs were ready.
      data_wait_s: seconds the loop waited for this step's data (not part of `step_s`).
      num_tokens: tokens the step processed, if known.
      tokens_per_s: `num_tokens / step_s`, or None when the token count is unknown.
      tflops_per_device: `flops_per_step / step_s / num_devices / 1e12`, or None when the
        FLOP count is unknown.
    """

    index: int
    name: str
    step_s: float
    data_wait_s: float
    num_tokens: int | None
    tokens_per_s: float | None
    tflops_per_device: float | None


def _json_line(record: StepRecord) -> str:
    """One record as a line of JSON, its keys the record's fields (`input-server plot-steps`
    reads them)."""
    return json.dumps(dataclasses.asdict(record)) + "\n"


def _wall_tokens_per_s(records: list[StepRecord]) -> float | None:
    """Tokens over the time the loop spent on them, data wait included: what the run delivers,
    where the per-step rates on device time alone say nothing of an input-bound loop."""
    known = [r for r in records if r.num_tokens is not None]
    spent = sum(r.step_s + r.data_wait_s for r in known)
    return sum(r.num_tokens for r in known) / spent if known and spent > 0 else None


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without importing numpy."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


class StepTimer:
    """Times device execution of train steps; data wait, compilation and profiling kept apart.

    Step time measured around an asynchronous dispatch alone says nothing (JAX returns before
    the device has run), and step time measured from one `next()` to the next mixes in the
    input pipeline. So `step` dispatches the step, waits with `jax.block_until_ready` for its
    outputs, and records that span alone; the data wait before the step is recorded beside it.
    TFLOP/s and tokens/s are computed on device time; the input-bound fraction is
    wait / (wait + device); the wall-clock tokens/s counts the data wait too (not the host's
    other work between steps, which the timer does not see). Named steps (the first, compiling
    one; profiler start/stop) can be left out of summaries.

    With `records_path`, each record is appended to that file as a line of JSON as soon as it
    is made (`input-server plot-steps FILE` draws them), so a run killed midway keeps its steps.

    Usage:
      timer = StepTimer(tokens_per_step=B * L, flops_per_step=6 * n_params * B * L,
                        data_source=batches, records_path="steps.jsonl")
      for batch in batches:
        state, metrics = timer.step(p_train_step, state, batch)
      print(timer.format_summary())
    """

    def __init__(
        self,
        *,
        tokens_per_step: int | None = None,
        flops_per_step: float | None = None,
        num_devices: int | None = None,
        exclude: Iterable[str] = DEFAULT_EXCLUDE,
        data_source: WaitSource | None = None,
        records_path: str | os.PathLike[str] | None = None,
    ):
        """Args:
          tokens_per_step: tokens in one step's global batch (for tokens/s); a step's
            `num_tokens` argument overrides it.
          flops_per_step: FLOPs of one step across all devices (e.g. 6 * params * tokens), for
            TFLOP/s per device.
          num_devices: devices the step runs on; default `jax.local_device_count()`, asked only
            when first needed so the client imports without jax.
          exclude: step names left out of `summary()` by default; "compile" because the first
            step's time is compilation, not training.
          data_source: an object whose float `wait_time_s` counts seconds blocked in the data
            iterator; each step records its increase since the previous step as that step's
            data wait.
          records_path: a file each record is appended to as one line of JSON (its fields:
            index, name, step_s, data_wait_s, num_tokens, tokens_per_s, tflops_per_device),
            written and flushed when the step is recorded; lines already there are kept.

        Raises:
          ValueError: a count is not positive.
        """
        if tokens_per_step is not None and tokens_per_step <= 0:
            raise ValueError(f"`tokens_per_step` must be positive or None, got {tokens_per_step}.")
        if flops_per_step is not None and flops_per_step <= 0:
            raise ValueError(f"`flops_per_step` must be positive or None, got {flops_per_step}.")
        if num_devices is not None and num_devices <= 0:
            raise ValueError(
                f"`num_devices` must be positive or None (= all local devices), got {num_devices}."
            )
        if isinstance(exclude, str):
            raise ValueError(
                f"`exclude` must be a collection of step names, not one string, "
                f"got {exclude!r}; write ({exclude!r},)."
            )
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self._num_devices = num_devices
        self.exclude = frozenset(exclude)
        self.data_source = data_source
        # Waits that happened before the timer existed belong to no step.
        self._last_wait_s = self._read_wait()
        self.records: list[StepRecord] = []
        self.records_path = os.fspath(records_path) if records_path is not None else None

    @property
    def num_devices(self) -> int:
        """Devices per step; asks jax only on first use."""
        if self._num_devices is None:
            import jax

            self._num_devices = jax.local_device_count()
        return self._num_devices

    def _read_wait(self) -> float | None:
        if self.data_source is None:
            return None
        return float(self.data_source.wait_time_s)

    def _take_wait(self) -> float:
        """Data wait since the previous step, by the data source's running total."""
        now = self._read_wait()
        if now is None:
            return 0.0
        last = self._last_wait_s if self._last_wait_s is not None else now
        self._last_wait_s = now
        return max(0.0, now - last)

    def step(
        self,
        fn: Callable[..., T],
        *args: Any,
        name: str | None = None,
        num_tokens: int | None = None,
        data_wait_s: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Runs `fn(*args, **kwargs)`, waits until its outputs are ready, and records the time.

        Args:
          fn: the (usually jitted) train step.
          *args: its positional arguments.
          name: the record's name; default "compile" for the first step, "train" after.
          num_tokens: tokens in this step, overriding `tokens_per_step` (e.g. non-padding
            tokens only).
          data_wait_s: this step's data wait, overriding the data source's increase.
          **kwargs: its keyword arguments.

        Returns:
          What `fn` returned, with every array in it ready.
        """
        import jax

        # Read the data source before the step so the wait for this step's batch counts here.
        source_wait = self._take_wait()
        wait = source_wait if data_wait_s is None else float(data_wait_s)
        start = perf_counter()
        out = fn(*args, **kwargs)
        # Dispatch is asynchronous: without this the span would end before the device started.
        jax.block_until_ready(out)
        step_s = perf_counter() - start
        index = len(self.records)
        if name is None:
            name = "compile" if index == 0 else "train"
        tokens = num_tokens if num_tokens is not None else self.tokens_per_step
        tokens_per_s = tokens / step_s if tokens is not None and step_s > 0 else None
        tflops = None
        if self.flops_per_step is not None and step_s > 0:
            tflops = self.flops_per_step / step_s / self.num_devices / 1e12
        record = StepRecord(
            index=index,
            name=name,
            step_s=step_s,
            data_wait_s=wait,
            num_tokens=tokens,
            tokens_per_s=tokens_per_s,
            tflops_per_device=tflops,
        )
        self.records.append(record)
        if self.records_path is not None:
            # Opened per line: nothing to close, and each line is on disk when the step ends.
            with open(self.records_path, "a", encoding="utf-8") as f:
                f.write(_json_line(record))
        return out

    def write_jsonl(self, path: str | os.PathLike[str]) -> None:
        """Writes every record so far to `path` (replacing it), one line of JSON each, as
        `records_path` appends them."""
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(_json_line(r) for r in self.records)

    def summary(self, exclude: Iterable[str] | None = None) -> dict[str, Any]:
        """Aggregates the records, leaving out steps by name.

        Args:
          exclude: step names to leave out of every figure; default the constructor's.

        Returns:
          A dict: `steps` (counted), `excluded` (left out), `median_step_s`, `p90_step_s`,
          `total_step_s`, `total_data_wait_s`, `input_bound_fraction` (wait / (wait + step)
          over counted steps), `mean_tokens_per_s`, `mean_tflops_per_device` (means of the
          per-step rates, on device time), `wall_tokens_per_s` (tokens over device time plus
          data wait: what the loop delivered); and, whether counted or not, the first step's
          data wait (`first_data_wait_s`: the pipeline's start-up, which a server tuning its workers
          makes long) and its device time (`first_step_s`: compilation, for a jitted step).
          Figures are None where no step was counted or the inputs are unknown.
        """
        names = self.exclude if exclude is None else frozenset(exclude)
        counted = [r for r in self.records if r.name not in names]
        steps = sorted(r.step_s for r in counted)
        total_step = sum(steps)
        total_wait = sum(r.data_wait_s for r in counted)
        busy = total_step + total_wait
        return {
            "steps": len(counted),
            "excluded": len(self.records) - len(counted),
            "median_step_s": _percentile(steps, 50) if steps else None,
            "p90_step_s": _percentile(steps, 90) if steps else None,
            "total_step_s": total_step,
            "total_data_wait_s": total_wait,
            "input_bound_fraction": total_wait / busy if busy > 0 else None,
            "mean_tokens_per_s": _mean([r.tokens_per_s for r in counted]),
            "mean_tflops_per_device": _mean([r.tflops_per_device for r in counted]),
            "wall_tokens_per_s": _wall_tokens_per_s(counted),
            "first_data_wait_s": self.records[0].data_wait_s if self.records else None,
            "first_step_s": self.records[0].step_s if self.records else None,
        }

    def format_summary(self, exclude: Iterable[str] | None = None) -> str:
        """The summary as a small two-column table for logs and terminals.

        Args:
          exclude: as for `summary`.

        Returns:
          Lines of `label  value`, no trailing newline.
        """
        s = self.summary(exclude)

        def num(value: float | None, fmt: str) -> str:
            return "n/a" if value is None else format(value, fmt)

        def ms(value: float | None) -> str:
            return "n/a" if value is None else f"{value * 1e3:.2f} ms"

        rows = [
            ("steps timed", f"{s['steps']} ({s['excluded']} excluded)"),
            ("median step", ms(s["median_step_s"])),
            ("p90 step", ms(s["p90_step_s"])),
            ("total step time", f"{s['total_step_s']:.3f} s"),
            ("total data wait", f"{s['total_data_wait_s']:.3f} s"),
            ("input-bound fraction", num(s["input_bound_fraction"], ".1%")),
            ("tokens/s, device time", num(s["mean_tokens_per_s"], ",.0f")),
            ("tokens/s, wall clock", num(s["wall_tokens_per_s"], ",.0f")),
            ("TFLOP/s/device", num(s["mean_tflops_per_device"], ".4g")),
            (
                "first step's data wait",
                num(s["first_data_wait_s"], ".3f") + " s"
                if s["first_data_wait_s"] is not None
                else "n/a",
            ),
            (
                "first step (compile)",
                num(s["first_step_s"], ".3f") + " s" if s["first_step_s"] is not None else "n/a",
            ),
        ]
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
