"""StepTimer: the device time of each JAX train step, with the time spent waiting for data apart
(and, on several JAX processes, the worst host's)."""

from __future__ import annotations

import collections
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from input_client import _pod_start, step_table
from input_client import badput as badput_records
from input_client.badput import BadputTally, RunBadput
from input_client.pod import PodGather, PodStep, PodTally
from input_client.step_histogram import histogram_percentile, percentile
from input_client.step_record import StepRecord, json_line, new_run_id
from input_client.step_tally import StepTally

# An alias, so tests can put a fake clock in its place and check the arithmetic exactly.
perf_counter = time.perf_counter

T = TypeVar("T")

log = logging.getLogger(__name__)

DEFAULT_EXCLUDE = ("compile",)

# Steps per all-gather on several processes: a gather's cost, a small array a process, is in
# docs/benchmarks.md ("The pod's view").
DEFAULT_POD_EVERY = 10

# How long each process waits, before the pod's first gather, for the others to reach it: long
# enough for a slow host's start-up (a cold cache, a tokenizer to fetch), which holds every chip
# at the first train step's collectives anyway; past it a host is more likely gone than late.
DEFAULT_POD_WAIT_S = 600.0

# Records kept in memory, the most recent: a long profile's or a stall's steps to look back on.
# Every figure over the whole run comes from running sums instead (issue 50: a record a step,
# kept for the whole run, grew a long run's trainer without bound).
DEFAULT_KEEP_RECORDS = 10_000


class WaitSource(Protocol):
    """Anything that counts the seconds a training loop spent blocked waiting for data (the
    batch iterator: its `wait_time_s` grows by the time each `next()` blocked)."""

    wait_time_s: float


def _check_arguments(
    *,
    tokens_per_step: int | None,
    flops_per_step: float | None,
    num_devices: int | None,
    exclude: Iterable[str],
    run_id: str | None,
    pod_every: int,
    pod_wait_s: float,
    keep_records: int,
) -> None:
    """`StepTimer`'s arguments, refused with the value and the way out."""
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
    if isinstance(pod_every, bool) or not isinstance(pod_every, int) or pod_every < 0:
        raise ValueError(
            f"`pod_every` must be a whole number of steps >= 0 (0 = never gather), "
            f"got {pod_every!r}."
        )
    if isinstance(pod_wait_s, bool) or not isinstance(pod_wait_s, int | float) or pod_wait_s < 0:
        raise ValueError(
            f"`pod_wait_s` must be a number of seconds >= 0 (how long a process waits for the "
            f"others before the first gather), got {pod_wait_s!r}."
        )
    if isinstance(keep_records, bool) or not isinstance(keep_records, int) or keep_records < 0:
        raise ValueError(
            f"`keep_records` must be a whole number of records >= 0 (0 = keep none in memory), "
            f"got {keep_records!r}."
        )
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
        raise ValueError(
            f"`run_id` must be a non-empty string or None (= a new one), got {run_id!r}."
        )


class StepTimer:
    """Times device execution of train steps; data wait, compilation and profiling kept apart.

    Step time measured around an asynchronous dispatch alone says nothing (JAX returns before
    the device has run), and step time measured from one `next()` to the next mixes in the
    input pipeline. So `step` dispatches the step, waits with `jax.block_until_ready` for its
    outputs, and records that span alone; the data wait before the step is recorded beside it.
    Every rate of the summary is a total over a total: TFLOP/s and tokens/s on device time are
    the counted steps' FLOPs and tokens over their device seconds, never a mean of each step's
    rate (which weighs a fast step like a slow one: an uneven loop read far above what it
    processed); the input-bound fraction is wait / (wait + device). The wall-clock tokens/s is
    tokens over real time: each step counts the seconds from the previous step's end to its
    own, so everything the loop does between steps (data wait, logging, checkpoints, a sleep)
    slows it as it slows the run; a figure on step + data wait alone is kept beside it, and the
    gap between the two is the loop's own time. Named steps (the first, compiling one; profiler
    start/stop) can be left out of summaries, their real time with them.

    Memory stays flat however long the run: `records` holds the most recent `keep_records`
    steps only (every record held for the whole run grew a long run's trainer without bound),
    and every figure of `summary()` and `badput()` comes from running sums kept per step name
    (so names are meant to be few, not one a step). The median and p90 step time are exact
    while every step is still in `records`; past that they come from a histogram of step
    times, each within `step_histogram.PERCENTILE_ACCURACY` of the exact figure.

    With `records_path`, each record is appended to that file as a line of JSON as soon as it
    is made (`input-server plot-steps FILE` draws them), so a run killed midway keeps its steps;
    the file, not `records`, is where every step of a long run is kept. Each line carries the
    timer's `run_id`, so runs appended to one file stay apart.

    On several JAX processes (`jax.process_count() > 1`) a pod trains in lock step, so one host
    waiting for data holds every chip. Every `pod_every` steps the timer gathers each process's
    data wait and step time for those steps (one small all-gather, dispatched after the window's
    last step and read when it has arrived) into `pod_steps` (the most recent `keep_records`):
    per step, the worst host's wait and which process it was. Each record's JSON line then
    carries them too (`process`, `worst_process`, `worst_data_wait_s`, `worst_step_s`) and is
    written when its window has been gathered; the summary adds the pod's figures by the worst
    host; and `badput()` is the run's data-loading badput (the worst host's first-batch and step
    waits). Every process must time the same steps (the gather is a collective) and call
    `flush()` after the loop, which gathers the last, shorter window. On one process nothing of
    this runs.

    Usage:
      timer = StepTimer(tokens_per_step=B * L, flops_per_step=6 * n_params * B * L,
                        data_source=batches, records_path="steps.jsonl")
      for batch in batches:
        state, metrics = timer.step(p_train_step, state, batch)
      timer.flush()  # on several processes: every process, at the same point
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
        run_id: str | None = None,
        pod_every: int = DEFAULT_POD_EVERY,
        badput_path: str | os.PathLike[str] | None = None,
        keep_records: int = DEFAULT_KEEP_RECORDS,
        pod_wait_s: float = DEFAULT_POD_WAIT_S,
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
            run, index, name, step_s, data_wait_s, wall_s, num_tokens, tokens_per_s,
            tflops_per_device), written and flushed when the step is recorded (on several
            processes, with the pod's fields, once its window is gathered); lines already
            there (earlier runs) are kept.
          run_id: the `run` of every line this timer writes; default `new_run_id()`, the UTC
            start time and a random suffix. Lines of one run share it; give your own (an
            experiment name) to find a run by it in `plot-steps --run`.
          pod_every: on several JAX processes, gather every process's figures every this many
            steps (lines of JSON then lag their step by up to this many steps); 0 = never, each
            process keeps its own view. Ignored on one process.
          badput_path: a file the run's data-loading badput (`badput()`, a `RunBadput` line) is
            appended to each time it grows (each gathered window; on one process every
            `pod_every` steps) and at `flush()`, so a run killed midway keeps its figure.
            Written by process 0 only; `input_client.badput.job_badput(path)` sums the runs.
          keep_records: how many of the most recent records `records` (and `pod_steps`) hold;
            0 = none. The summary covers every step whatever it is; `write_jsonl` writes the
            kept ones.
          pod_wait_s: on several JAX processes, how long each waits after its first step for
            every other to finish its own (a late host's first batch) before building the
            gather. The wait runs in Python, not in a collective, whose first run on CPU (gloo)
            fails after a fixed deadline; past it the pod gives up its view for this run on every
            process, naming the late processes
            (`pod_late`, the summary's `pod_late_processes`). A SIGTERM (jax's preemption
            notice) while waiting ends the process (docs/pod.md).

        Raises:
          ValueError: a count is not positive (`pod_every`, `keep_records` negative), or
            `run_id` is not a non-empty string.
        """
        _check_arguments(
            tokens_per_step=tokens_per_step, flops_per_step=flops_per_step, num_devices=num_devices,
            exclude=exclude, run_id=run_id, pod_every=pod_every, pod_wait_s=pod_wait_s,
            keep_records=keep_records,
        )  # fmt: skip
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self._num_devices = num_devices
        self.exclude = frozenset(exclude)
        self.data_source = data_source
        # Waits that happened before the timer existed belong to no step.
        self._last_wait_s = self._read_wait()
        self.keep_records = keep_records
        self._start_sums()
        self.records_path = os.fspath(records_path) if records_path is not None else None
        self.run_id = run_id if run_id is not None else new_run_id()
        self.pod_every = pod_every
        self.pod_wait_s = pod_wait_s
        self.badput_path = os.fspath(badput_path) if badput_path is not None else None
        self._pod_state()
        # The first step's real time counts from here, as its data wait does.
        self._last_end = perf_counter()

    def _pod_state(self) -> None:
        """The pod's side, before the first step: whether this timer gathers is known there
        (jax is imported there, not before), its gather built once the pod met."""
        # The processes the pod gave up waiting for after the first step (then no gather).
        self.pod_late: tuple[int, ...] = ()
        self._met = False  # whether the pod has met after the first step
        self._meeting = ""  # the meeting's name, taken with the gather's set-up
        self._pod: PodGather | None = None
        self._gathering = False
        self._processes = 1
        self._process_index: int | None = None
        self._gathered = 0  # steps sent to a gather so far

    def _start_sums(self) -> None:
        """What the run gathers as its steps come: the recent windows and the running sums."""
        # The most recent records, oldest first: a bounded window, not the run (the class).
        self.records: collections.deque[StepRecord] = collections.deque(maxlen=self.keep_records)
        self.pod_steps: collections.deque[PodStep] = collections.deque(maxlen=self.keep_records)
        self._count = 0  # steps timed
        self._first: StepRecord | None = None
        self._tallies: dict[str, StepTally] = {}  # a step name's running sums
        self._pod_tallies: dict[str, PodTally] = {}  # the same, of the gathered steps
        # On several processes: the records not yet gathered and written, in order (at most
        # about two windows: the one in flight and the one filling).
        self._unwritten: collections.deque[StepRecord] = collections.deque()
        self._badput_tally = BadputTally()  # the badput so far, by each step's worst host

    @property
    def steps_timed(self) -> int:
        """Steps timed so far (`records` keeps only the most recent `keep_records`)."""
        return self._count

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
        if self._process_index is None:
            # Before `start`: compiling the gather is the first step's real time, not its own.
            self._start_pod()
        start = perf_counter()
        out = fn(*args, **kwargs)
        # Dispatch is asynchronous: without this the span would end before the device started.
        jax.block_until_ready(out)
        end = perf_counter()
        step_s = end - start
        # From the previous step's end: what the loop did between steps is this step's cost.
        wall_s = end - self._last_end
        self._last_end = end
        self._keep(self._record(step_s, wait, wall_s, name, num_tokens))
        return out

    def _record(
        self, step_s: float, wait: float, wall_s: float, name: str | None, num_tokens: int | None
    ) -> StepRecord:
        """The next step's record, with its rates."""
        index = self._count
        if name is None:
            name = "compile" if index == 0 else "train"
        tokens = num_tokens if num_tokens is not None else self.tokens_per_step
        tokens_per_s = tokens / step_s if tokens is not None and step_s > 0 else None
        tflops = None
        if self.flops_per_step is not None and step_s > 0:
            tflops = self.flops_per_step / step_s / self.num_devices / 1e12
        return StepRecord(
            index=index,
            name=name,
            step_s=step_s,
            data_wait_s=wait,
            wall_s=wall_s,
            num_tokens=tokens,
            tokens_per_s=tokens_per_s,
            tflops_per_device=tflops,
        )

    def _keep(self, record: StepRecord) -> None:
        """Adds a record to the running sums and the recent window, and writes its line (on
        several processes, once its window is gathered)."""
        self._count += 1
        if self._first is None:
            self._first = record
        tally = self._tallies.get(record.name)
        if tally is None:
            tally = self._tallies[record.name] = StepTally()
        tally.add(record)
        self.records.append(record)
        if self._gathering:
            self._unwritten.append(record)
            self._advance_pod()
            return
        self._write_own(record)
        if self.pod_every and self._count % self.pod_every == 0:
            self._write_badput()

    def _write_own(self, record: StepRecord) -> None:
        """Counts a record in by this process's own wait and writes its line (no pod's view)."""
        self._badput_tally.add(record.data_wait_s, self._process_index or 0)
        if self.records_path is not None:
            # Opened per line: nothing to close, and each line is on disk when the step ends.
            with open(self.records_path, "a", encoding="utf-8") as f:
                f.write(json_line(self.run_id, record))

    def _start_pod(self) -> None:
        """Asks jax how many processes run; on several (and `pod_every` > 0), sets up the
        gather."""
        import jax

        self._process_index = jax.process_index()
        self._processes = jax.process_count()
        if self.pod_every and self._processes > 1:
            self._gathering = True
            self._meeting = _pod_start.next_meeting_name()

    def _pod_met(self) -> bool:
        """After the first step (its batch here), waits in Python for every process to have
        done its own, then builds the gather; False when the pod gave up on a late host: then no
        process gathers, and each keeps its own view."""
        if self._met:
            return True
        self._met = True
        client = _pod_start.distributed_client()
        # Without a store to meet in, building the gather is the only way to wait.
        late = () if client is None else _pod_start.meet(
            client, self._meeting, process=self._process_index, processes=self._processes,
            wait_s=self.pod_wait_s,
        )  # fmt: skip
        if not late:
            # Built only now: compiling a multi-process computation waits for every process
            # too, where a late host's start-up met the collectives' deadline.
            self._pod = PodGather(self.pod_every)
            # Start-up, as compilation: the late host's wait is its first batch's data wait.
            self._last_end = perf_counter()
            return True
        log.warning(
            "StepTimer: processes %s of %d had not finished their first step when the pod "
            "stopped waiting for them (`pod_wait_s` %.0f s); the pod's view is off for this run "
            "on every process, each keeps its own figures (process %d here). A late host's "
            "first batch: docs/pod.md.",
            list(late), self._processes, self.pod_wait_s, self._process_index,
        )  # fmt: skip
        self.pod_late = late
        self._gathering = False
        # No gathered figures will come for the steps waiting for them: written as they are.
        for record in self._unwritten:
            self._write_own(record)
        self._unwritten.clear()
        return False

    def _advance_pod(self) -> None:
        """Takes in a gathered window once it has arrived; sends the next once it is full."""
        if not self._pod_met():
            return
        pod = self._pod
        if pod.ready():
            self._absorb(pod.collect())
        if self._count - self._gathered >= self.pod_every:
            if pod.pending:  # one in flight at a time; a window later, it has long arrived
                self._absorb(pod.collect())
            self._submit(self.pod_every)

    def _submit(self, count: int) -> None:
        """Sends the next `count` steps not yet gathered."""
        # The unwritten records start at the oldest window not yet absorbed: maybe in flight.
        skip = self._gathered - self._unwritten[0].index if self._unwritten else 0
        window = list(itertools.islice(self._unwritten, skip, skip + count))
        self._pod.submit(
            self._gathered, [r.data_wait_s for r in window], [r.step_s for r in window]
        )
        self._gathered += count

    def _absorb(self, rows: list[tuple[int, tuple[float, ...], tuple[float, ...]]]) -> None:
        """Keeps a gathered window's steps and writes their lines (and the badput so far)."""
        # Windows come back in the order they were sent: theirs are the oldest unwritten.
        records = [self._unwritten.popleft() for _ in rows]
        steps = [
            PodStep(index=i, name=r.name, data_wait_s=waits, step_s=times)
            for r, (i, waits, times) in zip(records, rows, strict=True)
        ]
        self.pod_steps.extend(steps)
        for s in steps:
            self._badput_tally.add(s.worst_data_wait_s, s.worst_process)
            tally = self._pod_tallies.get(s.name)
            if tally is None:
                tally = self._pod_tallies[s.name] = PodTally()
            tally.add(s)
        if self.records_path is not None:
            with open(self.records_path, "a", encoding="utf-8") as f:
                f.writelines(
                    json_line(self.run_id, r, s, self._process_index)
                    for r, s in zip(records, steps, strict=True)
                )
        self._write_badput()

    def flush(self) -> None:
        """Gathers the steps not yet gathered (the last, shorter window) and writes their lines
        and the run's badput.

        On several processes this is a collective: every process calls it at the same point
        (after the loop, before `summary()`), having timed the same steps. It always gathers
        once, an empty window too, so a process that timed more steps than another raises
        (RuntimeError, on every process) instead of waiting for a gather nobody joins. On one
        process it writes the badput line (with `badput_path`) and nothing else.
        """
        gathering = self._gathering and self._pod_met()
        pod = self._pod if gathering else None
        if pod is None:
            if self._count:
                self._write_badput()
            return
        if pod.pending:
            self._absorb(pod.collect())
        self._submit(self._count - self._gathered)
        self._absorb(pod.collect())

    def badput(self) -> RunBadput:
        """This run's data-loading badput so far: its first batch's wait plus every later step's,
        each by the worst host of the step (on several processes, over the gathered steps; on
        one, or with `pod_every=0`, this process's own waits)."""
        processes = self._pod.processes if self._pod is not None else 1
        return self._badput_tally.figure(self.run_id, processes)

    def _write_badput(self) -> None:
        # Process 0 alone: every process holds the same gathered figures.
        if self.badput_path is not None and not self._process_index:
            badput_records.append(self.badput_path, self.badput())

    def write_jsonl(self, path: str | os.PathLike[str]) -> None:
        """Writes the kept records (`records`: every step of a run no longer than
        `keep_records`, else the most recent) to `path` (replacing it), one line of JSON each,
        as `records_path` appends them; `records_path` is the way to keep every step of a long
        run."""
        pod = {s.index: s for s in self.pod_steps}
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(
                json_line(self.run_id, r, pod.get(r.index), self._process_index)
                for r in self.records
            )

    def summary(self, exclude: Iterable[str] | None = None) -> dict[str, Any]:
        """Aggregates the records, leaving out steps by name.

        Args:
          exclude: step names to leave out of every figure; default the constructor's.

        Returns:
          A dict: `steps` (counted), `excluded` (left out), `median_step_s`, `p90_step_s`,
          `total_step_s`, `total_data_wait_s`, `total_wall_s` (the counted steps' real time),
          `total_other_s` (of it, the loop's own time outside steps and data waits),
          `input_bound_fraction` (wait / (wait + step) over counted steps); rates, each the
          counted steps' total over the time it names (never a mean of per-step rates):
          `device_tokens_per_s` (tokens over device time), `tflops_per_device` (TFLOP a device
          over device time), `step_and_wait_tokens_per_s` (tokens over device time plus data
          wait: the rate were the loop to do nothing else), `wall_tokens_per_s` (tokens over
          real time: what the loop delivered); and, whether counted or not, the first step's
          data wait (`first_data_wait_s`: the pipeline's start-up, which a server tuning its
          workers makes long) and its device time (`first_step_s`: compilation, for a jitted
          step).
          On several processes (see the class), over the gathered steps not left out, by the
          worst host of each step: `pod_processes`, and `pod_summary`'s `pod_steps`,
          `pod_worst_data_wait_s`, `pod_input_bound_fraction`, `pod_input_bound_steps` (the
          share over 5 %), `pod_highly_input_bound_steps` (over 20 %), `pod_most_often_worst`;
          and, counted or not as `first_data_wait_s` is for this process, the worst host's wait
          for the first batch and its process (`pod_first_data_wait_s`, `pod_first_process`:
          the badput's `first_batch_wait_s`), None until the first step is gathered. Where the pod
          gave up waiting for a late host after the first step: `pod_late_processes` alone. The
          first step is left out as compilation, and with it a host whose pipeline started late,
          holding every chip, which this process's own `first_data_wait_s` does not show.
          Figures are None where no step was counted or the inputs are unknown. Every figure
          covers every step timed, from running sums; the median and p90 are exact while
          `records` still holds every step, and within `step_histogram.PERCENTILE_ACCURACY`
          after.
        """
        names = self.exclude if exclude is None else frozenset(exclude)
        t = StepTally.merged(v for k, v in self._tallies.items() if k not in names)
        median, p90 = self._percentiles(names, t)
        first = self._first
        return {
            "steps": t.steps,
            "excluded": self._count - t.steps,
            "median_step_s": median,
            "p90_step_s": p90,
            **t.figures(),
            "first_data_wait_s": first.data_wait_s if first is not None else None,
            "first_step_s": first.step_s if first is not None else None,
            **self._pod_summary(names),
        }

    def _percentiles(self, names: frozenset[str], t: StepTally) -> tuple[float | None, ...]:
        """The median and p90 step time of the counted steps: exact from `records` while it
        holds every step, else from the histogram of them all."""
        if not t.steps:
            return None, None
        if self._count <= len(self.records):
            steps = sorted(r.step_s for r in self.records if r.name not in names)
            return percentile(steps, 50), percentile(steps, 90)
        return histogram_percentile(t.buckets, 50), histogram_percentile(t.buckets, 90)

    def _pod_summary(self, names: frozenset[str]) -> dict[str, Any]:
        """The pod's figures over the gathered steps not left out, and its first batch's worst
        wait whether left out or not (none on one process)."""
        if self.pod_late:
            return {"pod_late_processes": list(self.pod_late)}
        if self._pod is None:
            return {}
        counted = PodTally.merged(v for k, v in self._pod_tallies.items() if k not in names)
        # The badput's tally holds the first gathered step's worst host (the run's first batch).
        first = self._badput_tally
        gathered = first.steps > 0
        return {
            "pod_processes": self._pod.processes,
            **counted.figures(),
            "pod_first_data_wait_s": first.first_batch_wait_s if gathered else None,
            "pod_first_process": first.first_batch_process if gathered else None,
        }

    def format_summary(self, exclude: Iterable[str] | None = None) -> str:
        """The summary as a small two-column table for logs and terminals (`step_table`).

        Args:
          exclude: as for `summary`.

        Returns:
          Lines of `label  value`, no trailing newline.
        """
        return step_table.table(self.summary(exclude))
