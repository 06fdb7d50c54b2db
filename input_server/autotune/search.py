"""Autotune search: which parallelism to measure next, as a pure function of the table.

In-process threads first, doubling, then worker processes when the threads leave cores idle
(per-record Python work holds the GIL) or fall short of the target; a candidate over a cap is
recorded as skipped, with its memory predicted from the rows of its kind.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from input_server.autotune.measurements import Measurement
from input_server.autotune.policy import (
    GIL_BOUND_SHARE,
    MAX_THREADS,
    PLATEAU_GAIN,
    TARGET_HEADROOM,
    THREAD_PATIENCE,
    over_cap,
    why_out,
)
from input_server.batching.parallelism import Parallelism


@dataclasses.dataclass(frozen=True)
class Candidate:
    """What to run next; `skip` says why it will not run ("ram cap", "max workers")."""

    parallelism: Parallelism
    skip: str = ""


def _predicted_rss_mb(c: Candidate, rows: Sequence[Measurement]) -> float:
    """The memory `c` would add: per worker, as the last measured row of its kind (in-process
    threads, or processes), times its workers. 0 before a row of its kind ran: a thread's
    memory says nothing of a process's (a whole interpreter), known only by running one."""
    p = c.parallelism
    same_kind = [m for m in rows if m.ran and m.parallelism.in_process == p.in_process]
    return same_kind[-1].rss_mb_per_worker * p.workers if same_kind else 0.0


def capped(
    c: Candidate, rows: Sequence[Measurement], *, max_workers: int, ram_budget_mb: float
) -> Candidate:
    """`c`, with `skip` saying which cap it is over by its workers or predicted memory."""
    skip = over_cap(
        c.parallelism.workers,
        _predicted_rss_mb(c, rows),
        max_workers=max_workers,
        ram_budget_mb=ram_budget_mb,
    )
    return dataclasses.replace(c, skip=skip) if skip else c


def _stalled(rows: Sequence[Measurement], patience: int) -> bool:
    """Whether the last `patience` rows each failed to beat all rows before them by
    PLATEAU_GAIN."""
    if len(rows) <= patience:
        return False
    best = max(m.batches_per_s for m in rows[:-patience])
    return all(m.batches_per_s < (1 + PLATEAU_GAIN) * best for m in rows[-patience:])


def next_candidate(
    measurements: Sequence[Measurement],
    *,
    cpus: int,
    ram_budget_mb: float = math.inf,
    target_batches_per_s: float = 0.0,
    max_workers: int = 0,
    host_busy: bool = False,
) -> Candidate | None:
    """What to measure next, given the table so far; None when the search is over. Pure.

    In-process threads first, doubling (1, 2, 4, ... MAX_THREADS; the core count on the way:
    `_more_threads`) until a step gains under PLATEAU_GAIN (below the core count, two in a
    row: noise). Then processes (2, 4, ... up
    to `cpus`, the in-process choice's threads shared among them) only if the in-process runs
    left cores idle (per-record Python work holds the GIL) or fell short of the target; they
    stop after one doubling without gain. One process is not tried: it adds a copy of every
    group for no more parallelism than the server's own threads. Nor are any when the caller
    measured too few idle cores on the host while the in-process candidates ran for
    processes, dearer in CPU, to gain (`host_busy`, `policy.PROCESS_CPU_COST`). A target met ends
    everything. A candidate over a cap (`capped`) comes back with `skip` set (the caller
    records it), which ends its kind's search.
    """
    caps = dict(max_workers=max_workers, ram_budget_mb=ram_budget_mb)
    fits = [m for m in measurements if m.ran and not why_out(m, **caps)]
    if target_batches_per_s > 0 and any(
        m.batches_per_s >= TARGET_HEADROOM * target_batches_per_s for m in fits
    ):
        return None
    # By threads: a live search walks down as well as up, and appends what it measures in
    # that order; doubling from the last row proposed a rung already measured (a switch and
    # a window for nothing, after a walk down to 1 thread).
    inproc = sorted(
        (m for m in measurements if m.parallelism.in_process), key=lambda m: m.parallelism.threads
    )
    procs = [m for m in measurements if not m.parallelism.in_process]

    def check(processes: int, threads: int) -> Candidate:
        return capped(Candidate(Parallelism(processes, threads)), measurements, **caps)

    if not procs:
        ran = [m for m in inproc if m.ran]
        if not inproc:
            return check(0, 1)
        last = inproc[-1].parallelism.threads
        patience = THREAD_PATIENCE if last < cpus else 1
        more = _more_threads(last, cpus)
        if inproc[-1].ran and more <= MAX_THREADS and not _stalled(ran, patience):
            return check(0, more)
        # The in-process search is over; are processes worth their cost?
        gil_bound = bool(ran) and max(m.cpu_cores for m in ran) < GIL_BOUND_SHARE * cpus
        short = target_batches_per_s > 0
        if cpus < 2 or not ran or not (gil_bound or short) or host_busy:
            return None
        return check(2, _threads_per_process(ran, 2))
    ran = [m for m in procs if m.ran]
    processes = 2 * procs[-1].parallelism.processes
    if not procs[-1].ran or processes > cpus or _stalled(ran, 1):
        return None
    return check(processes, _threads_per_process([m for m in inproc if m.ran], processes))


def _more_threads(threads: int, cpus: int) -> int:
    """The next thread count after `threads`: double, but the host's cores on the way (13 on
    a TPU v5e host: 8 threads left 5 cores idle, 16 oversubscribe them)."""
    return cpus if threads < cpus < 2 * threads else 2 * threads


def _threads_per_process(inproc: Sequence[Measurement], processes: int) -> int:
    # Keep the in-process choice's concurrency (what latency needs), spread over processes
    # (what the GIL needs).
    if not inproc:
        return 1
    best = max(m.batches_per_s for m in inproc)
    threads = next(
        m.parallelism.threads
        for m in sorted(inproc, key=lambda m: m.parallelism)
        if m.batches_per_s * (1 + PLATEAU_GAIN) >= best
    )
    return max(1, threads // processes)


def ladder(cpus: int, *, default_threads) -> list[Parallelism]:
    """The candidates a demand walk moves along, cheapest first: in-process threads doubling
    up to twice the cores (and the cores themselves), then worker processes doubling up to
    the cores."""
    threads = sorted({*_doubling(1, max(2, 2 * cpus)), cpus})
    rungs = [Parallelism(0, t) for t in threads]
    rungs += [Parallelism(p, default_threads(p)) for p in _doubling(2, cpus)]
    return rungs


def _doubling(first: int, last: int) -> list[int]:
    out, n = [], first
    while n <= last:
        out.append(n)
        n *= 2
    return out


def skipped_row(c: Candidate, rows: Sequence[Measurement]) -> Measurement:
    return Measurement(parallelism=c.parallelism, rss_mb=_predicted_rss_mb(c, rows), skipped=c.skip)
