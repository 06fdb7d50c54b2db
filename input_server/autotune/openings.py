"""The parallelism each stream opens with, and the choices "auto" streams settled on.

A fixed `workers.count` opens as it is. "auto" opens at once: at the choice remembered for the
spec (in memory, else in the on-disk cache, `remembered.TuneCache`) — its first batch made in
process on the opening's threads when that choice has worker processes or more threads
(`Opening.bridged`) — or in process on the opening's threads; the stream then tunes while it
serves (`online`, `serving/retune.py`) and hands its settled choice back
(`Openings.remember`). One `Openings` belongs to one server.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Protocol

from input_client.spec import PipelineSpec
from input_server.autotune.measurements import Tuning
from input_server.autotune.policy import MAX_THREADS
from input_server.autotune.remembered import TuneCache
from input_server.batching.budget import UNBOUNDED, StreamBudget
from input_server.batching.parallelism import Parallelism, default_threads
from input_server.batching.pipeline import Pipeline
from input_server.plurals import plural

# An "auto" stream with nothing remembered opens in process on at most this many threads: its
# first batch needs a group or two, and more threads at once finish those later where the
# tokenizer contends with itself (tiktoken's reference on a many-core host: docs/benchmarks.md,
# "Time to a first batch after a (re)start"). The live search measures upward from there.
OPENING_THREADS = 2


def opening_threads(max_workers: int = 0, max_threads: int = MAX_THREADS) -> int:
    """The threads an "auto" stream with nothing remembered opens with, within the spec's
    `workers.max_workers` (0: none) and `max_threads` (what memory allows)."""
    return min(default_threads(0), OPENING_THREADS, max_workers or MAX_THREADS, max_threads)


def remembered_reason(tuning: Tuning) -> str:
    """Why a stream runs at the choice remembered for its spec."""
    return f"auto, remembered: {tuning.summary()}"


class Processes(Protocol):
    """The server's worker processes as one stream may take them
    (`serving.slots.ProcessReservation`)."""

    cap: int  # the server's --max-workers, for messages

    def take_up_to(self, n: int) -> int: ...


@dataclasses.dataclass(frozen=True)
class Opening:
    """The parallelism a stream opens with, why, and the remembered tuning behind it (None:
    fixed, nothing remembered, or a remembered choice this stream could not have)."""

    parallelism: Parallelism
    reason: str
    remembered: Tuning | None = None

    @classmethod
    def fixed(cls, count: int, threads: int = 0) -> Opening:
        """A fixed `workers.count` (and `workers.threads`, 0 = default)."""
        by = "workers.count and workers.threads" if threads else "workers.count"
        return cls(Parallelism.fixed(count, threads), f"fixed by {by}")

    def bridged(self, threads: int) -> Opening:
        """This remembered opening started in process on `threads` instead, when that is
        less: worker processes take seconds to start (a TPU host's restart waited ~2 s for
        them), and many threads finish a first group later than few (`OPENING_THREADS`). The
        stream's tuner switches to the remembered choice once the first batch is out, the
        running stage serving until the new one has its first group."""
        p = self.parallelism
        if p.in_process and p.threads <= threads:
            return self
        return dataclasses.replace(
            self,
            parallelism=Parallelism(0, threads),
            reason=f"{self.reason}; its first batch in process on {plural(threads, 'thread')}",
        )

    def clipped(self, processes: int, *, cap: int) -> Opening:
        """This opening cut to the `processes` free of the server's `cap` (--max-workers), with
        their default threads; what was remembered does not hold for it."""
        return Opening(
            Parallelism(processes, default_threads(processes)),
            f"{self.reason}; clipped to the {processes} free of the server's --max-workers "
            f"{cap} processes",
        )


class Openings:
    """Opens each stream of a spec's `workers` table, and keeps the choices "auto" settled on.

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

    def choose(
        self, pipeline: Pipeline, *, processes: Processes, budget: StreamBudget = UNBOUNDED
    ) -> Opening:
        """How a new stream of `pipeline` opens. For "auto", the worker processes a remembered
        choice runs are taken from `processes` here, before its first batch, made in process
        (`Opening.bridged`), needs them (none for a fixed count: the caller waits for those);
        a remembered choice over what is free is clipped to it, opens there, and is tuned
        from there like a new one. The in-process start keeps to `max_workers` and to the
        threads the stream's `budget` fits."""
        w = pipeline.spec.workers
        if w.count != "auto":
            return Opening.fixed(w.count, w.threads)
        remembered = self._recall(pipeline)
        fit = budget.threads_fit()
        threads = opening_threads(w.max_workers, MAX_THREADS if fit is None else fit)
        if remembered is None:
            return Opening(
                Parallelism(0, threads),
                f"auto: started at once in process with {plural(threads, 'thread')}; tuning on the "
                f"live stream",
            )
        opening = Opening(remembered.parallelism, remembered_reason(remembered), remembered)
        wanted = opening.parallelism.processes
        got = processes.take_up_to(wanted) if wanted else 0
        if got != wanted:
            return opening.clipped(got, cap=processes.cap)
        return opening.bridged(threads)

    def remember(self, pipeline: Pipeline, tuning: Tuning) -> None:
        """Keeps a settled choice for the spec's later streams (and restarts, with a cache)."""
        self._keep((type(pipeline), pipeline.spec), tuning)
        if self._cache is not None:
            self._cache.put(pipeline.spec, tuning)

    def _recall(self, pipeline: Pipeline) -> Tuning | None:
        key = (type(pipeline), pipeline.spec)
        with self._lock:
            remembered = self._decided.get(key)
        if remembered is None and self._cache is not None:
            remembered = self._cache.get(pipeline.spec)
            if remembered is not None:
                self._keep(key, remembered)
        return remembered

    def _keep(self, key: tuple[type, PipelineSpec], tuning: Tuning) -> None:
        with self._lock:
            self._decided[key] = tuning
            self._decided.move_to_end(key)
            while len(self._decided) > self._max_remembered:
                self._decided.popitem(last=False)
