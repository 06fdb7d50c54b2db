"""The offline search: a spec's pipeline measured at candidate parallelisms, then the choice.

For `input-server tune` and the benchmarks. Grain's `pick_performance_config` divides a RAM
budget by the size of five sampled elements and caps at the CPU count; it never measures
speed. `tune` runs the spec's own pipeline at each candidate (`measure`, its batches
discarded) in the order `search.next_candidate` gives, and stops on a plateau, once the demand
is met, at the RAM budget (the memory its workers add, measured) or the time bound; then it
measures the choice and its close contenders once more and decides on both windows
(`policy`). A served stream is tuned online instead (`online`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Sequence

from input_server import cancel
from input_server.autotune import report
from input_server.autotune.measure import WARMUP_S, WINDOW_S, clock, measure
from input_server.autotune.measurements import Measurement, Tuning
from input_server.autotune.policy import (
    SERVER_CAP,
    TUNE_SECONDS,
    contenders,
    cpu_count,
    decide,
    pool,
)
from input_server.autotune.search import Candidate, capped, next_candidate, skipped_row
from input_server.batching.parallelism import Parallelism, default_threads
from input_server.batching.pipeline import Pipeline

log = logging.getLogger(__name__)

# One measurement at a time in a process: two at once would measure each other.
_measuring = threading.RLock()

# Called with each candidate before it runs (None) and after (its row).
Progress = Callable[[Candidate, Measurement | None], None]


def tune(
    pipeline: Pipeline,
    *,
    target_batches_per_s: float = 0.0,
    max_workers: int = 0,
    ram_budget_mb: float = math.inf,
    tune_seconds: float = TUNE_SECONDS,
    warmup_s: float = WARMUP_S,
    window_s: float = WINDOW_S,
    candidates: Sequence[Parallelism] | None = None,
    progress: Progress | None = None,
    max_processes: int | None = None,
) -> Tuning:
    """Measures candidates (`next_candidate`'s search, or the given ones) and decides.

    Args:
      pipeline: the pipeline to tune; its batches during tuning are discarded.
      target_batches_per_s: the consumer's demand; 0 = unknown (choose the plateau).
      max_workers: the most workers (processes x threads); 0 = no cap.
      ram_budget_mb: the most memory a candidate may add (`measure.added_bytes`), MiB.
      tune_seconds: the time bound; the candidate running at that moment is cut short.
      warmup_s, window_s: per candidate, see `measure`.
      candidates: the parallelisms to run in this order instead of searching (each still
        skipped when predicted over `ram_budget_mb` or `max_workers`).
      progress: called with each candidate before it runs (None) and after (its row).
      max_processes: the most worker processes a candidate may run (the server's free ones);
        None = no cap.

    A request's cancellation (`cancel.check`) stops it between candidates and within one.

    Returns:
      The `Tuning`; its choice never changes the data, only the speed.
    """
    settings = dict(
        ram_budget_mb=ram_budget_mb,
        target_batches_per_s=target_batches_per_s,
        max_workers=max_workers,
        cpus=cpu_count() or 1,
    )
    with _measuring:
        start = clock()
        deadline = start + tune_seconds
        run = _Runner(pipeline, progress, warmup_s=warmup_s, window_s=window_s, deadline=deadline)
        listed = None if candidates is None else list(candidates)
        rows = run.search(listed, max_processes=max_processes, **settings)
        if not any(m.ran for m in rows):
            return _unmeasured(rows, tune_seconds=tune_seconds, elapsed=clock() - start, **settings)
        tuning = decide(rows, **settings)
        again = contenders(rows, tuning, cpus=settings["cpus"])
        if again:
            run.look_again(rows, [tuning.chosen, *again])
            tuning = decide(rows, **settings)
        tuning = dataclasses.replace(tuning, tune_seconds=clock() - start)
    log.info("autotune chose %s\n%s", tuning.summary(), report.table(tuning))
    return tuning


@dataclasses.dataclass
class _Runner:
    """Runs one tuning's candidates on `pipeline` until `deadline` (a `clock()` time)."""

    pipeline: Pipeline
    progress: Progress | None
    warmup_s: float
    window_s: float
    deadline: float

    def search(
        self, listed: list[Parallelism] | None, *, max_processes: int | None, **settings
    ) -> list[Measurement]:
        """The table: each candidate measured, or skipped with why, until the search (or
        `listed`) ends or the time bound cuts it."""
        rows: list[Measurement] = []
        while (c := _next(rows, listed, **settings)) is not None:
            cancel.check()
            if max_processes is not None and c.parallelism.processes > max_processes:
                c = c if c.skip else dataclasses.replace(c, skip=SERVER_CAP)
            self._report(c, None)
            row = self._row(c, rows)
            rows.append(row)
            log.debug("autotune: %s", row)
            self._report(c, row)
            if row.skipped == "time limit":
                break
        return rows

    def _row(self, c: Candidate, rows: Sequence[Measurement]) -> Measurement:
        """`c` measured, or skipped: over a cap, or out of time before or while it ran."""
        if c.skip:
            return skipped_row(c, rows)
        late = dataclasses.replace(c, skip="time limit")
        if self.deadline - clock() < self.warmup_s + 0.25 * self.window_s:
            return skipped_row(late, rows)
        row = self._measure(c.parallelism)
        return skipped_row(late, rows) if row is None else row

    def look_again(self, rows: list[Measurement], which: Sequence[Measurement]) -> None:
        """A second look: each of `which` (the choice and its close contenders) measured once
        more, side by side, and pooled into its row, as the time left allows."""
        for m in which:
            cancel.check()
            if self.deadline - clock() < m.startup_s + self.warmup_s + self.window_s:
                continue
            c = Candidate(m.parallelism)
            self._report(c, None)
            more = self._measure(m.parallelism)
            if more is not None:
                i = next(i for i, r in enumerate(rows) if r is m)
                rows[i] = pool(rows[i], more)
                self._report(c, rows[i])

    def _measure(self, parallelism: Parallelism) -> Measurement | None:
        return measure(
            self.pipeline,
            parallelism,
            warmup_s=self.warmup_s,
            window_s=self.window_s,
            deadline=self.deadline,
        )

    def _report(self, c: Candidate, row: Measurement | None) -> None:
        if self.progress is not None:
            self.progress(c, row)


def _next(
    rows: Sequence[Measurement],
    listed: list[Parallelism] | None,
    *,
    cpus: int,
    ram_budget_mb: float,
    target_batches_per_s: float,
    max_workers: int,
) -> Candidate | None:
    """The search's next candidate, or the next of `listed` (taken from it); None: done."""
    if listed is None:
        return next_candidate(
            rows,
            cpus=cpus,
            ram_budget_mb=ram_budget_mb,
            target_batches_per_s=target_batches_per_s,
            max_workers=max_workers,
        )
    if not listed:
        return None
    return capped(
        Candidate(listed.pop(0)), rows, max_workers=max_workers, ram_budget_mb=ram_budget_mb
    )


def _unmeasured(
    rows: Sequence[Measurement], *, tune_seconds: float, elapsed: float, cpus: int, **settings
) -> Tuning:
    """The choice when no candidate finished within the time bound: the in-process default,
    so the stream still runs (at the speed a fixed `workers.count = 0` would)."""
    threads = default_threads(0)
    log.warning(
        "autotune: no candidate finished within tune_seconds=%g; running in-process "
        "with %d threads",
        tune_seconds,
        threads,
    )
    return Tuning(
        parallelism=Parallelism(0, threads),
        reason="time limit",
        detail=f"no candidate finished within tune_seconds={tune_seconds:g}; the "
        f"in-process default ({threads} threads) runs unmeasured; allow more "
        f"`workers.tune_seconds` to measure",
        measurements=tuple(rows),
        tune_seconds=elapsed,
        **settings,
    )


def grain_choice(pipeline: Pipeline, *, ram_budget_mb: int | None = None) -> Parallelism:
    """The anchor this replaces: Grain's `pick_performance_config` (RAM budget / the size of
    five sampled elements, capped at the CPU count), with the default threads per process."""
    from grain.experimental import pick_performance_config

    budget = pipeline.spec.workers.ram_budget_mb if ram_budget_mb is None else ram_budget_mb
    config = pick_performance_config(
        pipeline.groups().to_iter_dataset(),
        ram_budget_mb=budget,
        max_workers=None,
        max_buffer_size=None,
    )
    processes = config.multiprocessing_options.num_workers
    return Parallelism(processes, default_threads(processes))
