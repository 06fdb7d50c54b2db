"""What a live search reads from the host's busy cores: whether worker processes could gain,
whether the loop took as much at a cheaper candidate, and how much its windows jump. Pure.

A loop (the trainer, or the client decoding) that shares the host's cores with the stream
takes less the more CPU the stream's workers take; its pace, not the stream's capacity read
from busy time, then says which candidate served it best (`online.OnlineSearch`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from input_server.autotune.measurements import Measurement
from input_server.autotune.policy import PLATEAU_GAIN, PROCESS_CPU_COST
from input_server.batching.parallelism import Parallelism

# How much the loop's pace in one 1 s window may differ from its pace at the same parallelism
# in another, before any candidate was measured twice: on the 2-core development host, fixed
# counts' 1 s windows jump by about a fifth (docs/benchmarks.md, "The live search on fast
# tokenizers"). Measured windows replace it (`Cores.spread`).
DEFAULT_SPREAD = 0.2
# The spread is read from this many repeated windows at least, and held within these bounds:
# a few quiet windows must not make one slow window count as the truth.
MIN_SPREAD_WINDOWS = 3
SPREAD_BOUNDS = (0.1, 0.35)


class Cores:
    """Per candidate, the windows' seconds, the server's and the whole host's CPU seconds and
    the batches the loop took; and the loop's pace in each window (its spread)."""

    def __init__(self, cpus: int):
        self.cpus = cpus
        self._sums: dict[Parallelism, tuple[float, float, float, float]] = {}
        self._paces: dict[Parallelism, list[float]] = {}

    def add(
        self, p: Parallelism, *, seconds: float, server_cores: float, host_cores: float, took: float
    ) -> None:
        """One window of `p`: the server's and the host's busy cores, the loop's batches/s."""
        s, server, host, taken = self._sums.get(p, (0.0, 0.0, 0.0, 0.0))
        self._sums[p] = (
            s + seconds,
            server + server_cores * seconds,
            host + host_cores * seconds,
            taken + took * seconds,
        )
        self._paces.setdefault(p, []).append(took)

    def keep_only(self, p: Parallelism) -> None:
        """Forgets the other candidates' figures (of another time); `p`'s go on."""
        self._sums = {k: v for k, v in self._sums.items() if k == p}

    def took(self, p: Parallelism) -> float | None:
        """The loop's batches/s over `p`'s windows (None: not measured)."""
        sums = self._sums.get(p)
        return sums[3] / sums[0] if sums and sums[0] > 0 else None

    def busy(self, rows: Iterable[Measurement]) -> bool:
        """Whether the host had too few idle cores, while the fastest in-process candidate of
        `rows` ran, for worker processes to gain on it (`policy.PROCESS_CPU_COST`)."""
        inproc = [r for r in rows if r.ran and r.parallelism.in_process]
        if not inproc:
            return False
        best = max(inproc, key=lambda r: r.batches_per_s).parallelism
        seconds, server, host, _ = self._sums.get(best, (0.0, 0.0, 0.0, 0.0))
        if seconds <= 0 or server <= 0:
            return False  # not measured
        idle = max(0.0, self.cpus * seconds - host)
        return server + idle < PROCESS_CPU_COST * (1 + PLATEAU_GAIN) * server

    def as_good(self, cheap: Parallelism, dear: Parallelism) -> bool:
        """Whether the loop took as much (within PLATEAU_GAIN) while `cheap` ran as while
        `dear` did (the caller asks only on busy cores)."""
        a, b = self.took(cheap), self.took(dear)
        return a is not None and b is not None and (1 + PLATEAU_GAIN) * a >= b

    def spread(self) -> float:
        """How far one window of the loop's pace may fall from its pace at the same candidate:
        twice the relative standard deviation of the windows measured more than once (pooled),
        DEFAULT_SPREAD before MIN_SPREAD_WINDOWS such windows."""
        deviations = []
        for paces in self._paces.values():
            if len(paces) > 1 and (mean := statistics.fmean(paces)) > 0:
                deviations += [(x - mean) / mean for x in paces]
        if len(deviations) < MIN_SPREAD_WINDOWS:
            return DEFAULT_SPREAD
        # Bessel's correction per candidate: n windows around their own mean keep n - 1.
        kept = len(deviations) - sum(1 for p in self._paces.values() if len(p) > 1)
        sd = math.sqrt(sum(d * d for d in deviations) / max(1, kept))
        low, high = SPREAD_BOUNDS
        return min(high, max(low, 2 * sd))

    def could_be_as_good(self, cheap: Parallelism, dear: Parallelism) -> bool:
        """Whether one window of `cheap` that read worse than `dear` lies within the loop's
        own window spread of it (`spread`): worth a second window; past it, `cheap` is worse
        and a second look would only cost the trainer a switch and a window."""
        a, b = self.took(cheap), self.took(dear)
        if a is None or b is None:
            return False
        return (1 + PLATEAU_GAIN) * a >= (1 - self.spread()) * b
