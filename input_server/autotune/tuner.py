"""Autotune: picks a stream's worker processes and threads by measuring its real pipeline.

Grain's `pick_performance_config` divides a RAM budget by the size of five sampled elements
and caps at the CPU count; it never measures speed. Two ways measure here, with the same
policy (`policy`, `search`):

- offline, `tune` (for `input-server tune` and the benchmarks): runs the spec's own pipeline
  at candidate (processes, threads) (`measure`), its batches discarded, and stops on a
  plateau, once the demand is met, at the RAM budget (measured RSS) or the time bound;
- online, on a served stream (`online`, `serving/retune.py`): the stream starts at once and
  its parallelism moves while it serves, measured on its real production.

A `Tuner`, owned by a server, gives a stream its starting parallelism and keeps the choices.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Sequence

from input_client.spec import PipelineSpec
from input_server import cancel
from input_server.autotune import report
from input_server.autotune.measure import WARMUP_S, WINDOW_S, clock, measure
from input_server.autotune.policy import (
    MAX_THREADS,
    SERVER_CAP,
    TUNE_SECONDS,
    Measurement,
    Tuning,
    contenders,
    cpu_count,
    decide,
    pool,
)
from input_server.autotune.remembered import TuneCache
from input_server.autotune.search import Candidate, capped, next_candidate, skipped_row
from input_server.batching.pipeline import Pipeline, Workers, default_threads, fixed_workers

log = logging.getLogger(__name__)

# One measurement at a time in a process: two at once would measure each other.
_measuring = threading.RLock()


def tune(
    pipeline: Pipeline,
    *,
    target_batches_per_s: float = 0.0,
    max_workers: int = 0,
    ram_budget_mb: float = math.inf,
    tune_seconds: float = TUNE_SECONDS,
    warmup_s: float = WARMUP_S,
    window_s: float = WINDOW_S,
    candidates: Sequence[tuple[int, int]] | None = None,
    progress: Callable[[Candidate, Measurement | None], None] | None = None,
    max_processes: int | None = None,
) -> Tuning:
    """Measures candidates (`next_candidate`'s search, or the given ones) and decides.

    Args:
      pipeline: the pipeline to tune; its batches during tuning are discarded.
      target_batches_per_s: the consumer's demand; 0 = unknown (choose the plateau).
      max_workers: the most workers (processes x threads); 0 = no cap.
      ram_budget_mb: the most memory a candidate may add (measured RSS), MiB.
      tune_seconds: the time bound; the candidate running at that moment is cut short.
      warmup_s, window_s: per candidate, see `measure`.
      candidates: (processes, threads) to run in this order instead of searching (each still
        skipped when predicted over `ram_budget_mb` or `max_workers`).
      progress: called with each candidate before it runs (None) and after (its row).
      max_processes: the most worker processes a candidate may run (the server's free ones);
        None = no cap.

    A request's cancellation (`cancel.check`) stops it between candidates and within one.

    Returns:
      The `Tuning`; its choice never changes the data, only the speed.
    """
    cpus = cpu_count() or 1
    listed = list(candidates or [])
    with _measuring:
        start = clock()
        deadline = start + tune_seconds
        rows: list[Measurement] = []
        while True:
            if candidates is None:
                c = next_candidate(
                    rows,
                    cpus=cpus,
                    ram_budget_mb=ram_budget_mb,
                    target_batches_per_s=target_batches_per_s,
                    max_workers=max_workers,
                )
            elif listed:
                c = capped(
                    Candidate(*listed.pop(0)),
                    rows,
                    max_workers=max_workers,
                    ram_budget_mb=ram_budget_mb,
                )
            else:
                c = None
            if c is None:
                break
            cancel.check()
            if max_processes is not None and c.processes > max_processes and not c.skip:
                c = dataclasses.replace(c, skip=SERVER_CAP)
            if progress is not None:
                progress(c, None)
            if c.skip:
                row = skipped_row(c, rows)
            elif deadline - clock() < warmup_s + 0.25 * window_s:
                row = skipped_row(dataclasses.replace(c, skip="time limit"), rows)
            else:
                row = measure(
                    pipeline,
                    c.processes,
                    c.threads,
                    warmup_s=warmup_s,
                    window_s=window_s,
                    deadline=deadline,
                )
                if row is None:
                    row = skipped_row(dataclasses.replace(c, skip="time limit"), rows)
            rows.append(row)
            log.debug("autotune: %s", row)
            if progress is not None:
                progress(c, row)
            if row.skipped == "time limit":
                break
        settings = dict(
            ram_budget_mb=ram_budget_mb,
            target_batches_per_s=target_batches_per_s,
            max_workers=max_workers,
            cpus=cpus,
        )
        if not any(m.ran for m in rows):
            return _unmeasured(rows, tune_seconds=tune_seconds, elapsed=clock() - start, **settings)
        tuning = decide(rows, **settings)
        # A second look: the choice and its close contenders once more, side by side.
        again = contenders(rows, tuning, cpus=cpus)
        for m in (tuning.chosen, *again) if again else ():
            cancel.check()
            if deadline - clock() < m.startup_s + warmup_s + window_s:
                continue
            c = Candidate(m.processes, m.threads)
            if progress is not None:
                progress(c, None)
            more = measure(
                pipeline,
                m.processes,
                m.threads,
                warmup_s=warmup_s,
                window_s=window_s,
                deadline=deadline,
            )
            if more is not None:
                i = next(i for i, r in enumerate(rows) if r is m)
                rows[i] = pool(rows[i], more)
                if progress is not None:
                    progress(c, rows[i])
        if again:
            tuning = decide(rows, **settings)
        tuning = dataclasses.replace(tuning, tune_seconds=clock() - start)
    log.info("autotune chose %s\n%s", tuning.summary(), report.table(tuning))
    return tuning


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
        processes=0,
        threads=threads,
        reason="time limit",
        detail=f"no candidate finished within tune_seconds={tune_seconds:g}; the "
        f"in-process default ({threads} threads) runs unmeasured; allow more "
        f"`workers.tune_seconds` to measure",
        measurements=tuple(rows),
        tune_seconds=elapsed,
        **settings,
    )


class Tuner:
    """Resolves a spec's `workers` table to the parallelism its streams start with, and keeps
    the choices "auto" settled on.

    A fixed `workers.count` is used as it is. "auto" starts at once: at the choice remembered
    for the spec (in memory, else in the on-disk cache), or in process with the default
    threads; the stream then tunes while it serves (`online`, `serving/retune.py`) and hands
    its settled choice back (`remember`). One `Tuner` belongs to one server.

    Args:
      max_remembered: choices kept in memory, the oldest forgotten first.
      cache: where choices persist across restarts (`remembered.TuneCache`); None = nowhere.
    """

    def __init__(self, *, max_remembered: int = 64, cache: TuneCache | None = None):
        self._cache = cache
        self._lock = threading.Lock()
        # By the pipeline's kind and spec: a stand-in source (testing.SlowPipeline) over the
        # same files is another pipeline.
        self._decided: collections.OrderedDict[tuple[type, PipelineSpec], Tuning] = (
            collections.OrderedDict()
        )
        self._max_remembered = max_remembered

    def start(
        self,
        pipeline: Pipeline,
        *,
        max_processes: int | None = None,
        max_threads: int = MAX_THREADS,
    ) -> tuple[Workers, Tuning | None]:
        """The parallelism a new stream of `pipeline` opens with, and the remembered tuning
        behind it (None: fixed, nothing remembered, or a remembered choice this stream cannot
        have). A remembered choice over `max_processes` (the server's free worker processes)
        is clipped for this stream, and tuned from there like a new one; the provisional one
        keeps to `max_workers` and `max_threads` (what memory allows)."""
        w = pipeline.spec.workers
        if w.count != "auto":
            return fixed_workers(w.count, w.threads), None
        key = (type(pipeline), pipeline.spec)
        with self._lock:
            remembered = self._decided.get(key)
        if remembered is None and self._cache is not None:
            remembered = self._cache.get(pipeline.spec)
            if remembered is not None:
                self._keep(key, remembered)
        if remembered is None:
            threads = min(default_threads(0), w.max_workers or MAX_THREADS, max_threads)
            return Workers(
                0,
                threads,
                f"auto: started at once in process with {threads} "
                f"threads; tuning on the live stream",
            ), None
        workers = Workers(
            remembered.processes, remembered.threads, f"auto, remembered: {remembered.summary()}"
        )
        if max_processes is not None and workers.processes > max_processes:
            threads = default_threads(max_processes)
            return Workers(
                max_processes,
                threads,
                f"{workers.reason}; clipped to the {max_processes} free of the "
                f"server's --max-workers processes",
            ), None
        return workers, remembered

    def remember(self, pipeline: Pipeline, tuning: Tuning) -> None:
        """Keeps a settled choice for the spec's later streams (and restarts, with a cache)."""
        self._keep((type(pipeline), pipeline.spec), tuning)
        if self._cache is not None:
            self._cache.put(pipeline.spec, tuning)

    def _keep(self, key: tuple[type, PipelineSpec], tuning: Tuning) -> None:
        with self._lock:
            self._decided[key] = tuning
            self._decided.move_to_end(key)
            while len(self._decided) > self._max_remembered:
                self._decided.popitem(last=False)


def grain_choice(pipeline: Pipeline, *, ram_budget_mb: int | None = None) -> tuple[int, int]:
    """The anchor this replaces: Grain's `pick_performance_config` (RAM budget / the size of
    five sampled elements, capped at the CPU count), with the default threads per process.

    Returns:
      (processes, threads).
    """
    from grain.experimental import pick_performance_config

    budget = pipeline.spec.workers.ram_budget_mb if ram_budget_mb is None else ram_budget_mb
    config = pick_performance_config(
        pipeline.groups().to_iter_dataset(),
        ram_budget_mb=budget,
        max_workers=None,
        max_buffer_size=None,
    )
    processes = config.multiprocessing_options.num_workers
    return processes, default_threads(processes)
