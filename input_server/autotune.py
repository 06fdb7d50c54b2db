"""Autotune: picks a stream's worker processes and threads by measuring its real pipeline.

Grain's `pick_performance_config` divides a RAM budget by the size of five sampled elements
and caps at the CPU count; it never measures speed. This module runs the stream's own pipeline
(read + tokenize in parallel, pack in order) at candidate (processes, threads), times
production after a warm-up, and stops on a plateau, once the consumer's demand is met, at the
RAM budget (measured RSS) or at the time bound. `measure` runs one candidate; `next_candidate`
(what to run next) and `decide` (what to choose) are pure functions of the measurement table,
so the policy is testable on synthetic tables as well as on real runs.

A "worker" is one document group being read and tokenized at a time: a candidate has
`max(1, processes) * threads` of them. Threads in the server process are the cheap knob
(no memory of their own; each group's sentencepiece call runs on its own C++ threads, and a
thread waiting on remote storage costs no CPU); processes
pay off when per-record Python work holds the GIL, so they are tried only when the in-process
candidates leave cores idle or fall short of the target.

The tuning run's batches are discarded, never served: the stream then starts from its
requested position with the chosen workers, and the choice cannot change the data (the
batches are the same bytes for any processes and threads).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import os
import queue
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from input_client._queues import put_unless_stopped
from input_server.pipeline import Pipeline, Workers, default_threads

log = logging.getLogger(__name__)

# Module-level aliases so tests can pretend another host (STYLE.md item 4).
cpu_count = os.cpu_count
clock = time.perf_counter

# A step to more workers must add at least this much to count as progress ("a few percent");
# the choice is then within this fraction of the best rate measured.
PLATEAU_GAIN = 0.05
# Choosing among measured candidates: the cheapest within this of the fastest. Tighter than
# the search's plateau, since a candidate 5 % slower in a noisy window may be 15 % slower in
# truth (measured on a shared 2-core host), and an in-process thread costs no memory.
CHOICE_GAIN = 0.02
# With a target, the choice must measure this much above it, so the jitter of a shared host
# (and of the consumer) does not starve the trainer.
TARGET_HEADROOM = 1.2
# Production is timed after the first batch and this warm-up (thread pools filled, worker
# processes started and importing), over a window of at least WINDOW_S and MIN_BATCHES.
WARMUP_S = 0.3
WINDOW_S = 1.0
MIN_BATCHES = 4
# Groups of documents arrive whole, their batches together; a gap this many times the median
# between batches marks a new burst. Warm-up lasts until the first such wait (at most
# MAX_WARMUP_S), and the window then spans BURSTS production cycles (at most MAX_WINDOW x
# WINDOW_S): a window shorter than a cycle times packing, not production.
BURST_GAP = 5.0
BURSTS = 3
MAX_WARMUP_S = 2.0
MAX_WINDOW = 3.0
# Threads per process: latency-bound sources want many; past this, use processes.
MAX_THREADS = 128
# More workers than cores must gain this much: past the cores, extra threads only pay for
# waiting (remote storage gains ~2x a doubling); a CPU-bound gain that small is within the
# noise of a shared host, and oversubscribing the cores takes CPU from the trainer.
OVERSUBSCRIBE_GAIN = 0.2
# Below the core count, one step that gains nothing (noise on a busy host) does not end the
# thread search; a second one does. Past the cores, or for processes (a spawn each), one does.
THREAD_PATIENCE = 2
# After the search, the choice and the candidates within this band of it (and, when it has
# more workers than cores, the best within the cores) are measured once more, side by side,
# and decided on both windows: one window on a busy host is noisy (+-15 % and worse on the
# shared 2-core development machine).
CONFIRM_BAND = 0.15
CONFIRM_MAX = 2
# Processes are tried when the in-process candidates keep fewer than this share of the cores
# busy: their per-record Python work (and the packer, in the server) holds the GIL.
GIL_BOUND_SHARE = 0.9
TUNE_SECONDS = 20.0
REASONS = ("target met", "plateau", "ram cap", "max workers", "time limit", "fastest")
_MIB = 1 << 20


def _workers(processes: int, threads: int) -> int:
    """Document groups in flight at once: processes x threads (threads alone in-process)."""
    return max(1, processes) * threads


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement:
    """One candidate's measured production, or why it was skipped.

    Attributes:
      processes: worker processes (0 = inside the server process).
      threads: threads per process.
      batches_per_s: packed batches per second after warm-up (0 when skipped).
      tokens_per_s: real (non-padding) tokens per second after warm-up.
      rss_mb: memory the candidate added, in MiB: its worker processes' RSS plus the server
        process's RSS growth while it ran; predicted from a smaller candidate when skipped.
      cpu_cores: CPU seconds per second of the server process and its worker processes.
      startup_s: seconds from opening the stream to its first batch.
      seconds: length of the timed window(s).
      batches: batches in the timed window(s).
      samples: timed windows pooled into the rates (2 after the second look).
      skipped: "" when run, else why not: "ram cap", "max workers" or "time limit".
    """

    processes: int
    threads: int
    batches_per_s: float = 0.0
    tokens_per_s: float = 0.0
    rss_mb: float = 0.0
    cpu_cores: float = 0.0
    startup_s: float = 0.0
    seconds: float = 0.0
    batches: int = 0
    samples: int = 1
    skipped: str = ""

    @property
    def workers(self) -> int:
        return _workers(self.processes, self.threads)

    @property
    def rss_mb_per_worker(self) -> float:
        return self.rss_mb / self.workers

    @property
    def ran(self) -> bool:
        return not self.skipped

    def label(self) -> str:
        where = f"{self.processes} proc" if self.processes else "in-proc"
        return f"{where} x {self.threads} thr"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "workers": self.workers,
                "rss_mb_per_worker": self.rss_mb_per_worker}

    def to_proto(self):
        from input_client._proto.input_server.v1 import input_service_pb2 as pb

        return pb.WorkerMeasurement(
            processes=self.processes, threads=self.threads, batches_per_s=self.batches_per_s,
            tokens_per_s=self.tokens_per_s, rss_mb_per_worker=self.rss_mb_per_worker,
            cpu_cores=self.cpu_cores, startup_s=self.startup_s, skipped=self.skipped)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tuning:
    """The autotuner's choice, why, and the measurements behind it.

    Attributes:
      processes: chosen worker processes (0 = inside the server process).
      threads: chosen threads per process.
      reason: one of `REASONS`: "target met" (the fewest workers that meet the demand),
        "plateau" (more workers gained under PLATEAU_GAIN), "ram cap", "max workers" or
        "time limit" (the cap or the time bound stopped a search still gaining), "fastest"
        (every candidate ran; the choice is the fastest).
      detail: the reason in a sentence, with the figures.
      measurements: every candidate in the order it ran (or was skipped).
      target_batches_per_s: the demand the choice had to meet (0 = unknown).
      ram_budget_mb: the memory budget the candidates were held to.
      max_workers: the cap on workers (0 = none).
      tune_seconds: seconds the tuning took.
    """

    processes: int
    threads: int
    reason: str
    detail: str
    measurements: tuple[Measurement, ...]
    target_batches_per_s: float = 0.0
    ram_budget_mb: float = math.inf
    max_workers: int = 0
    tune_seconds: float = 0.0

    @property
    def workers(self) -> int:
        return _workers(self.processes, self.threads)

    @property
    def chosen(self) -> Measurement:
        """The measurement of the chosen candidate."""
        return next(m for m in self.measurements
                    if m.ran and (m.processes, m.threads) == (self.processes, self.threads))

    def summary(self) -> str:
        """One line for logs and `StreamInfo.worker_reason`."""
        return (f"{self.processes} processes x {self.threads} threads ({self.reason}: "
                f"{self.detail}; {sum(m.ran for m in self.measurements)} candidates measured "
                f"in {self.tune_seconds:.1f} s)")

    def table(self) -> str:
        """The measurements as a text table; the choice is marked with `*`."""
        lines = [f"  {'workers':>7} {'processes':>9} {'threads':>7} {'batches/s':>10} "
                 f"{'tokens/s':>10} {'RSS/worker':>11} {'CPU cores':>9} {'start s':>7}"]
        for m in self.measurements:
            mark = "*" if m.ran and (m.processes, m.threads) == (self.processes,
                                                                  self.threads) else " "
            if m.ran:
                rates = f"{m.batches_per_s:>10.1f} {_si(m.tokens_per_s):>10}"
                tail = f" {m.cpu_cores:>9.2f} {m.startup_s:>7.2f}"
            else:
                rates = f"{'-':>10} {'-':>10}"
                tail = f"  skipped: {m.skipped}"
            lines.append(f"{mark} {m.workers:>7} {m.processes:>9} {m.threads:>7} {rates} "
                         f"{m.rss_mb_per_worker:>7.1f} MiB{tail}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["measurements"] = [m.to_dict() for m in self.measurements]
        d["workers"] = self.workers
        if math.isinf(self.ram_budget_mb):
            d["ram_budget_mb"] = None
        return d

    def to_proto(self):
        """The `WorkerTuning` message the info RPC reports."""
        from input_client._proto.input_server.v1 import input_service_pb2 as pb

        return pb.WorkerTuning(reason=self.reason,
                               measurements=[m.to_proto() for m in self.measurements],
                               processes=self.processes, threads=self.threads,
                               target_batches_per_s=self.target_batches_per_s,
                               tune_seconds=self.tune_seconds)


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"


def _cost(m: Measurement) -> tuple[int, int]:
    # In-process threads before any process (no spawn, no copies, no per-process memory),
    # then fewer before more.
    return (m.processes, m.threads)


# --- Deciding -------------------------------------------------------------------------------


def decide(measurements: Sequence[Measurement], *, ram_budget_mb: float = math.inf,
           target_batches_per_s: float = 0.0, max_workers: int = 0,
           cpus: int | None = None) -> Tuning:
    """Chooses among measured candidates; pure, so it runs on synthetic tables too.

    With a target, the cheapest candidate whose rate is at least TARGET_HEADROOM x the target;
    otherwise (or when none meets it) the cheapest candidate within CHOICE_GAIN of the best
    rate, where candidates with more workers than `cpus` count only if the best of them beats
    the best within the cores by OVERSUBSCRIBE_GAIN. Candidates above `max_workers` or whose
    measured RSS exceeds `ram_budget_mb` are out. "Cheapest" orders in-process threads before
    processes, then by count.

    Args:
      measurements: the table, as `tune` builds it (skipped rows say why they were skipped).
      ram_budget_mb: memory the workers may add, MiB.
      target_batches_per_s: the consumer's demand; 0 = unknown.
      max_workers: the most workers (processes x threads); 0 = no cap.
      cpus: the host's cores; default `cpu_count()`.

    Returns:
      The `Tuning` (its `tune_seconds` is left 0 for the caller to fill).

    Raises:
      ValueError: no candidate was measured.
    """
    ran = sorted((m for m in measurements if m.ran), key=_cost)
    if not ran:
        raise ValueError("no candidate was measured; give the tuning more time "
                         "(`workers.tune_seconds`).")
    common = dict(measurements=tuple(measurements), target_batches_per_s=target_batches_per_s,
                  ram_budget_mb=ram_budget_mb, max_workers=max_workers)

    def why_out(m: Measurement) -> str:
        return _over_cap(m.workers, m.rss_mb, max_workers=max_workers,
                         ram_budget_mb=ram_budget_mb)

    fits = [m for m in ran if not why_out(m)]
    if not fits:
        least = min(ran, key=lambda m: (m.workers, m.rss_mb))
        return Tuning(processes=least.processes, threads=least.threads,
                      reason=why_out(least) or "ram cap",
                      detail=f"no candidate fits (ram_budget_mb={ram_budget_mb:g}, "
                             f"max_workers={max_workers}); the smallest, {least.label()}, "
                             f"adds {least.rss_mb:.0f} MiB", **common)
    best = max(fits, key=lambda m: m.batches_per_s)
    if target_batches_per_s > 0:
        need = TARGET_HEADROOM * target_batches_per_s
        meeting = [m for m in fits if m.batches_per_s >= need]
        if meeting:
            c, h = meeting[0], TARGET_HEADROOM
            return Tuning(processes=c.processes, threads=c.threads, reason="target met",
                          detail=f"the fewest workers ({c.workers}) that give {h:g} x the "
                                 f"target {target_batches_per_s:g} batches/s: "
                                 f"{c.batches_per_s:.1f} batches/s (best measured "
                                 f"{best.batches_per_s:.1f})", **common)
    cpus = cpus or cpu_count() or 1
    inside = [m for m in fits if m.workers <= cpus] or fits
    best_in = max(inside, key=lambda m: m.batches_per_s)
    pool = (fits if best.batches_per_s > (1 + OVERSUBSCRIBE_GAIN) * best_in.batches_per_s
            else inside)
    best = max(pool, key=lambda m: m.batches_per_s)
    c = next(m for m in pool if m.batches_per_s * (1 + CHOICE_GAIN) >= best.batches_per_s)
    rate = f"{c.batches_per_s:.1f} batches/s, {_si(c.tokens_per_s)} tokens/s"
    # Why nothing beyond the choice: a cap or the time bound cut a search still gaining, or
    # the rate stopped growing.
    faster_out = [m for m in ran if why_out(m) and m.batches_per_s
                  > (1 + PLATEAU_GAIN) * c.batches_per_s]
    cut = [m.skipped for m in measurements if m.skipped and _cost(m) > _cost(c)]
    if faster_out:
        reason = why_out(faster_out[0])
        detail = (f"{rate}; {faster_out[0].label()} was faster "
                  f"({faster_out[0].batches_per_s:.1f}) but over the {reason}")
    elif any(_cost(m) > _cost(c) for m in fits):
        reason = "plateau"
        detail = (f"{rate}; more workers added under {PLATEAU_GAIN:.0%} "
                  f"(best {best.batches_per_s:.1f} batches/s, {best.label()})")
        if pool is inside and len(inside) < len(fits):
            detail += (f", more than the {cpus} cores under {OVERSUBSCRIBE_GAIN:.0%}")
    elif cut:
        reason = cut[0]
        detail = f"{rate}; the {reason} stopped a search that was still gaining"
    else:
        reason = "fastest"
        detail = f"{rate}; the fastest of every candidate tried"
    if target_batches_per_s > 0:
        detail += (f"; the target {target_batches_per_s:g} batches/s (x {TARGET_HEADROOM:g} "
                   f"headroom) was not reached")
    return Tuning(processes=c.processes, threads=c.threads, reason=reason, detail=detail,
                  **common)


# --- Searching ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
    """What to run next; `skip` says why it will not run ("ram cap", "max workers")."""

    processes: int
    threads: int
    skip: str = ""

    @property
    def workers(self) -> int:
        return _workers(self.processes, self.threads)


def _over_cap(workers: int, rss_mb: float, *, max_workers: int, ram_budget_mb: float) -> str:
    """Why a candidate of `workers` that adds `rss_mb` is out: "max workers", "ram cap", or ""
    when it fits. The one cap check, for measured rows and for candidates not yet run."""
    if max_workers and workers > max_workers:
        return "max workers"
    return "ram cap" if rss_mb > ram_budget_mb else ""


def _predicted_rss_mb(c: Candidate, rows: Sequence[Measurement]) -> float:
    """The memory `c` would add: per worker, as the last measured row of its kind (in-process
    threads, or processes), times its workers. 0 before a row of its kind ran: a thread's
    memory says nothing of a process's (a whole interpreter), known only by running one."""
    same_kind = [m for m in rows if m.ran and (m.processes > 0) == (c.processes > 0)]
    return same_kind[-1].rss_mb_per_worker * c.workers if same_kind else 0.0


def _capped(c: Candidate, rows: Sequence[Measurement], *, max_workers: int,
            ram_budget_mb: float) -> Candidate:
    """`c`, with `skip` saying which cap it is over by its workers or predicted memory."""
    skip = _over_cap(c.workers, _predicted_rss_mb(c, rows), max_workers=max_workers,
                     ram_budget_mb=ram_budget_mb)
    return dataclasses.replace(c, skip=skip) if skip else c


def _stalled(rows: Sequence[Measurement], patience: int) -> bool:
    """Whether the last `patience` rows each failed to beat all rows before them by
    PLATEAU_GAIN."""
    if len(rows) <= patience:
        return False
    best = max(m.batches_per_s for m in rows[:-patience])
    return all(m.batches_per_s < (1 + PLATEAU_GAIN) * best for m in rows[-patience:])


def next_candidate(measurements: Sequence[Measurement], *, cpus: int,
                   ram_budget_mb: float = math.inf, target_batches_per_s: float = 0.0,
                   max_workers: int = 0) -> Candidate | None:
    """What to measure next, given the table so far; None when the search is over. Pure.

    In-process threads first, doubling (1, 2, 4, ... MAX_THREADS) until a doubling gains under
    PLATEAU_GAIN (below the core count, two in a row: noise). Then processes (2, 4, ... up
    to `cpus`, the in-process choice's threads shared among them) only if the in-process runs
    left cores idle (per-record Python work holds the GIL) or fell short of the target; they
    stop after one doubling without gain. One process is not tried: it adds a copy of every
    group for no more parallelism than the server's own threads. A target met ends
    everything. A candidate over a cap (`_capped`) comes back with `skip` set (the caller
    records it), which ends its kind's search.
    """
    caps = dict(max_workers=max_workers, ram_budget_mb=ram_budget_mb)
    fits = [m for m in measurements if m.ran and not _over_cap(m.workers, m.rss_mb, **caps)]
    if target_batches_per_s > 0 and any(
            m.batches_per_s >= TARGET_HEADROOM * target_batches_per_s for m in fits):
        return None
    inproc = [m for m in measurements if m.processes == 0]
    procs = [m for m in measurements if m.processes > 0]

    def check(c: Candidate) -> Candidate:
        return _capped(c, measurements, **caps)

    if not procs:
        ran = [m for m in inproc if m.ran]
        if not inproc:
            return check(Candidate(0, 1))
        threads = 2 * inproc[-1].threads
        patience = THREAD_PATIENCE if inproc[-1].threads < cpus else 1
        if (inproc[-1].ran and threads <= MAX_THREADS
                and not _stalled(ran, patience)):
            return check(Candidate(0, threads))
        # The in-process search is over; are processes worth their cost?
        gil_bound = bool(ran) and max(m.cpu_cores for m in ran) < GIL_BOUND_SHARE * cpus
        short = target_batches_per_s > 0
        if cpus < 2 or not ran or not (gil_bound or short):
            return None
        return check(Candidate(2, _threads_per_process(ran, 2)))
    ran = [m for m in procs if m.ran]
    processes = 2 * procs[-1].processes
    if not procs[-1].ran or processes > cpus or _stalled(ran, 1):
        return None
    return check(Candidate(processes, _threads_per_process([m for m in inproc if m.ran],
                                                           processes)))


def _threads_per_process(inproc: Sequence[Measurement], processes: int) -> int:
    # Keep the in-process choice's concurrency (what latency needs), spread over processes
    # (what the GIL needs).
    if not inproc:
        return 1
    best = max(m.batches_per_s for m in inproc)
    threads = next(m.threads for m in sorted(inproc, key=_cost)
                   if m.batches_per_s * (1 + PLATEAU_GAIN) >= best)
    return max(1, threads // processes)


# --- Measuring ------------------------------------------------------------------------------


def _produce(pipeline: Pipeline, workers: Workers, out: queue.Queue,
             stop: threading.Event) -> None:
    """Runs the stream from its start, again and again for short data, until `stop`."""

    def put(item) -> bool:
        return put_unless_stopped(out, item, stop, 0.05)

    try:
        while not stop.is_set():
            produced = 0
            with pipeline.stream(None, workers=workers) as stream:
                for batch in stream:
                    produced += 1
                    if not put((clock(), batch.num_tokens, None)):
                        return
            if produced == 0:
                put((clock(), 0, StopIteration()))
                return
    except Exception as e:  # noqa: BLE001 - re-raised by the measuring thread
        put((clock(), 0, e))


def _burst_starts(times: Sequence[float]) -> list[int]:
    """Indices of batches that end a wait: a group's batches come together, then a pause."""
    if len(times) < 3:
        return []
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    median = statistics.median(gaps)
    return [i + 1 for i, g in enumerate(gaps) if _ends_a_wait(g, median)]


def _ends_a_wait(gap: float, median_gap: float) -> bool:
    """Whether a gap between batches is a wait for the next group, not packing's pace."""
    return gap > max(BURST_GAP * median_gap, 1e-3)


def _rate(times: Sequence[float], tokens: Sequence[int], *,
          aligned: bool = False) -> tuple[float, float] | None:
    """(batches/s, tokens/s) from the arrival times and tokens of the window's batches.

    Over whole bursts when production is bursty (a burst's first batch to a later burst's
    first: a window cut mid-burst would count part of a group as if it took no time), else
    over the whole window (the batches after the first). `aligned`: batch 0 starts a burst.
    """
    starts = ([0] if aligned else []) + _burst_starts(times)
    n = len(times) - 1
    if len(starts) >= 2 and times[starts[-1]] - times[starts[0]] >= 0.5 * (times[n] - times[0]):
        a, b = starts[0], starts[-1]
        seconds = times[b] - times[a]
        return (b - a) / seconds, sum(tokens[a:b]) / seconds
    seconds = times[n] - times[0]
    if n < 1 or seconds <= 0:
        return None
    return n / seconds, sum(tokens[1:]) / seconds


def _process_usage(pids_before: set[int]) -> tuple[float, float, int]:
    """CPU seconds, RSS bytes of this process, and of worker processes started since."""
    import psutil

    me = psutil.Process()
    cpu = sum(me.cpu_times()[:2])
    child_rss = 0
    for child in me.children(recursive=True):
        if child.pid in pids_before:
            continue
        try:
            cpu += sum(child.cpu_times()[:2])
            child_rss += child.memory_info().rss
        except psutil.Error:  # ended meanwhile
            continue
    return cpu, me.memory_info().rss, child_rss


def measure(pipeline: Pipeline, processes: int, threads: int, *, warmup_s: float = WARMUP_S,
            window_s: float = WINDOW_S,
            max_warmup_s: float = MAX_WARMUP_S,
            deadline: float | None = None) -> Measurement | None:
    """Runs the pipeline's stream with `processes` x `threads` and times its production.

    The batches are counted and dropped. The stream runs on its own thread, so the deadline
    holds even when one batch takes longer than the time left (that thread then ends, and
    closes its workers, after its batch).

    Args:
      pipeline: the stream's pipeline; the candidate runs its real stream from the start.
      processes, threads: the candidate.
      warmup_s: seconds after the first batch before timing may start; it starts at the
        first wait for a batch after that, or at `max_warmup_s` at the latest.
      window_s: the timed window lasts at least this long and MIN_BATCHES batches (longer,
        up to `MAX_WINDOW` x, to span `BURSTS` cycles of bursty production).
      deadline: a `clock()` time at which to stop, timed or not.

    Returns:
      The measurement, or None when no batch was timed before the deadline.

    Raises:
      Whatever the pipeline raises (a bad record fails the tuning as it would the stream).
    """
    import psutil

    pids_before = {p.pid for p in psutil.Process().children(recursive=True)}
    rss_before = psutil.Process().memory_info().rss
    out: queue.Queue = queue.Queue(maxsize=256)
    stop = threading.Event()
    opened = clock()
    thread = threading.Thread(target=_produce, name=f"autotune-{processes}x{threads}",
                              args=(pipeline, Workers(processes, threads, "autotune candidate"),
                                    out, stop), daemon=True)
    thread.start()

    def take(until: float | None):
        while True:
            left = None if until is None else until - clock()
            if left is not None and left <= 0:
                return None
            try:
                t, tokens, err = out.get(timeout=left)
            except queue.Empty:
                return None
            if isinstance(err, StopIteration):
                return None
            if err is not None:
                raise err
            return t, tokens

    try:
        item = take(deadline)
        if item is None:
            return None
        first = item[0]
        # Warm-up, dropped: until the consumer has waited once after `warmup_s` (the groups
        # the workers finished together before the first batch are drained; timing them
        # would measure packing, not production), or at most the warm-up cap (smooth flow).
        cap = max(warmup_s, min(max_warmup_s, 2 * (first - opened)))
        last, gaps, cycle = item, [], 0.0
        while last[0] - first < cap:
            item = take(deadline)
            if item is None:
                return None
            gap = item[0] - last[0]
            waited = len(gaps) >= 2 and _ends_a_wait(gap, gaps[len(gaps) // 2])
            bisect.insort(gaps, gap)
            last = item
            if waited and last[0] - first >= warmup_s:
                cycle = last[0] - first
                break
        # The window: long enough for BURSTS production cycles when production is bursty;
        # it starts with the batch that ended the wait, a burst's first.
        length = min(max(window_s, BURSTS * cycle), MAX_WINDOW * window_s)
        cpu0 = _process_usage(pids_before)[0]
        wall0 = clock()
        times, counts = [last[0]], [last[1]]
        while times[-1] - times[0] < length or len(times) <= MIN_BATCHES:
            item = take(deadline)
            if item is None:
                break
            times.append(item[0])
            counts.append(item[1])
        rate = _rate(times, counts, aligned=cycle > 0)
        if rate is None or times[-1] - times[0] < 0.25 * window_s:  # cut short by the deadline
            return None
        batches_per_s, tokens_per_s = rate
        cpu1, rss, child_rss = _process_usage(pids_before)
        return Measurement(
            processes=processes, threads=threads, batches_per_s=batches_per_s,
            tokens_per_s=tokens_per_s, rss_mb=(child_rss + max(0, rss - rss_before)) / _MIB,
            cpu_cores=(cpu1 - cpu0) / max(clock() - wall0, 1e-9),
            startup_s=first - opened, seconds=times[-1] - times[0], batches=len(times) - 1)
    finally:
        stop.set()
        # Unblock the producer's put, then give it a moment to close its workers.
        while True:
            try:
                out.get_nowait()
            except queue.Empty:
                break
        thread.join(timeout=5.0 if deadline is None else max(0.0, min(5.0, deadline - clock())))


# --- Tuning ---------------------------------------------------------------------------------

# One tuning at a time per server process: two at once would measure each other.
_lock = threading.RLock()
# Decisions by spec, for pipelines that read the spec's own files: each stream that sends its
# spec builds a new `Pipeline`, and a trainer resuming (or reconnecting) must not wait for a
# second tuning. Pipelines with a substitute source (tests' slow storage) are kept apart, by
# object. The oldest decisions go first beyond _DECIDED_MAX specs.
_DECIDED_MAX = 64
_decided: dict[Any, Workers] = {}
_decided_substitute: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tune(pipeline: Pipeline, *, target_batches_per_s: float = 0.0, max_workers: int = 0,
         ram_budget_mb: float = math.inf, tune_seconds: float = TUNE_SECONDS,
         warmup_s: float = WARMUP_S, window_s: float = WINDOW_S,
         candidates: Sequence[tuple[int, int]] | None = None,
         progress: Callable[[Candidate, Measurement | None], None] | None = None) -> Tuning:
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

    Returns:
      The `Tuning`; its choice never changes the data, only the speed.
    """
    cpus = cpu_count() or 1
    listed = list(candidates or [])
    with _lock:
        start = clock()
        deadline = start + tune_seconds
        rows: list[Measurement] = []
        while True:
            if candidates is None:
                c = next_candidate(rows, cpus=cpus, ram_budget_mb=ram_budget_mb,
                                   target_batches_per_s=target_batches_per_s,
                                   max_workers=max_workers)
            elif listed:
                c = _capped(Candidate(*listed.pop(0)), rows, max_workers=max_workers,
                            ram_budget_mb=ram_budget_mb)
            else:
                c = None
            if c is None:
                break
            if progress is not None:
                progress(c, None)
            if c.skip:
                row = _skipped(c, rows)
            elif deadline - clock() < warmup_s + 0.25 * window_s:
                row = _skipped(dataclasses.replace(c, skip="time limit"), rows)
            else:
                row = measure(pipeline, c.processes, c.threads, warmup_s=warmup_s,
                              window_s=window_s, deadline=deadline)
                if row is None:
                    row = _skipped(dataclasses.replace(c, skip="time limit"), rows)
            rows.append(row)
            log.debug("autotune: %s", row)
            if progress is not None:
                progress(c, row)
            if row.skipped == "time limit":
                break
        settings = dict(ram_budget_mb=ram_budget_mb, target_batches_per_s=target_batches_per_s,
                        max_workers=max_workers, cpus=cpus)
        tuning = decide(rows, **settings)
        # A second look: the choice and its close contenders once more, side by side.
        again = contenders(rows, tuning, cpus=cpus)
        for m in (tuning.chosen, *again) if again else ():
            if deadline - clock() < m.startup_s + warmup_s + window_s:
                continue
            c = Candidate(m.processes, m.threads)
            if progress is not None:
                progress(c, None)
            more = measure(pipeline, m.processes, m.threads, warmup_s=warmup_s,
                           window_s=window_s, deadline=deadline)
            if more is not None:
                i = next(i for i, r in enumerate(rows) if r is m)
                rows[i] = pool(rows[i], more)
                if progress is not None:
                    progress(c, rows[i])
        if again:
            tuning = decide(rows, **settings)
        tuning = dataclasses.replace(tuning, tune_seconds=clock() - start)
    log.info("autotune chose %s\n%s", tuning.summary(), tuning.table())
    return tuning


def contenders(measurements: Sequence[Measurement], tuning: Tuning, *,
               cpus: int) -> list[Measurement]:
    """The candidates one more window might show to be the better choice. Pure.

    For "target met": cheaper candidates within CONFIRM_BAND below the needed rate. Otherwise:
    candidates whose rate is within CONFIRM_BAND of the choice's, the nearest CONFIRM_MAX, and
    when the choice has more workers than `cpus`, the fastest within the cores (the
    comparison that let it oversubscribe them).
    """
    c = tuning.chosen
    fits = [m for m in measurements if m.ran and m is not c and not _over_cap(
        m.workers, m.rss_mb, max_workers=tuning.max_workers, ram_budget_mb=tuning.ram_budget_mb)]
    if tuning.reason == "target met":
        need = TARGET_HEADROOM * tuning.target_batches_per_s
        close = [m for m in fits
                 if _cost(m) < _cost(c) and m.batches_per_s * (1 + CONFIRM_BAND) >= need]
        key = lambda m: need - m.batches_per_s  # noqa: E731
    else:
        close = [m for m in fits if abs(m.batches_per_s - c.batches_per_s)
                 <= CONFIRM_BAND * c.batches_per_s]
        key = lambda m: abs(m.batches_per_s - c.batches_per_s)  # noqa: E731
        inside = [m for m in fits if m.workers <= cpus]
        if c.workers > cpus and inside:
            best_in = max(inside, key=lambda m: m.batches_per_s)
            return [best_in, *[m for m in sorted(close, key=key)
                               if m is not best_in]][:CONFIRM_MAX]
    return sorted(close, key=key)[:CONFIRM_MAX]


def pool(a: Measurement, b: Measurement) -> Measurement:
    """Two measurements of one candidate as one: rates over both windows, the larger memory.

    Not the faster window: a window can also read fast (a burst timed short), and a high
    reading that only the choice got a second chance to keep would stick.
    """
    seconds = a.seconds + b.seconds

    def mean(x: float, y: float) -> float:
        return (x * a.seconds + y * b.seconds) / seconds

    return dataclasses.replace(
        a, batches_per_s=mean(a.batches_per_s, b.batches_per_s),
        tokens_per_s=mean(a.tokens_per_s, b.tokens_per_s), rss_mb=max(a.rss_mb, b.rss_mb),
        cpu_cores=mean(a.cpu_cores, b.cpu_cores), startup_s=max(a.startup_s, b.startup_s),
        seconds=seconds, batches=a.batches + b.batches, samples=a.samples + b.samples)


def _skipped(c: Candidate, rows: Sequence[Measurement]) -> Measurement:
    return Measurement(processes=c.processes, threads=c.threads,
                       rss_mb=_predicted_rss_mb(c, rows), skipped=c.skip)


def auto_workers(pipeline: Pipeline) -> Workers:
    """The workers for a `workers.count = "auto"` stream: tuned once per spec in this process.

    The first stream of a spec tunes; later streams of it (a trainer resuming after
    preemption, a client reconnecting) start at once with the same choice.
    """
    cache = _decided_substitute if pipeline.substitute_source else _decided
    key = pipeline if pipeline.substitute_source else pipeline.spec
    with _lock:
        workers = cache.get(key)
        if workers is None:
            w = pipeline.spec.workers
            tuning = tune(pipeline, target_batches_per_s=float(w.target_batches_per_s),
                          max_workers=w.max_workers, ram_budget_mb=w.ram_budget_mb,
                          tune_seconds=float(w.tune_seconds))
            workers = Workers(tuning.processes, tuning.threads, f"auto: {tuning.summary()}",
                              tuning=tuning)
            cache[key] = workers
            if len(_decided) > _DECIDED_MAX:
                del _decided[next(iter(_decided))]
        return workers


def grain_choice(pipeline: Pipeline, *, ram_budget_mb: int | None = None) -> tuple[int, int]:
    """The anchor this replaces: Grain's `pick_performance_config` (RAM budget / the size of
    five sampled elements, capped at the CPU count), with the default threads per process.

    Returns:
      (processes, threads).
    """
    from grain.experimental import pick_performance_config

    budget = pipeline.spec.workers.ram_budget_mb if ram_budget_mb is None else ram_budget_mb
    config = pick_performance_config(pipeline.groups().to_iter_dataset(),
                                     ram_budget_mb=budget, max_workers=None,
                                     max_buffer_size=None)
    processes = config.multiprocessing_options.num_workers
    return processes, default_threads(processes)


def plot(tuning: Tuning, path: str, *, title: str = "") -> None:
    """Draws batches/s against workers, in-process and per process count, choice marked.

    Raises:
      ImportError: matplotlib is not installed (`pip install matplotlib`).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from e
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ran = [m for m in tuning.measurements if m.ran]
    for processes in sorted({m.processes for m in ran}):
        pts = sorted((m for m in ran if m.processes == processes), key=lambda m: m.workers)
        label = "in-process threads" if processes == 0 else f"{processes} processes"
        ax.plot([m.workers for m in pts], [m.batches_per_s for m in pts], "o-", label=label)
    c = tuning.chosen
    ax.plot([c.workers], [c.batches_per_s], "r*", markersize=16,
            label=f"choice: {c.label()} ({tuning.reason})")
    if tuning.target_batches_per_s:
        ax.axhline(tuning.target_batches_per_s, color="gray", linestyle="--",
                   label="target")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_ylim(bottom=0)  # ratios read true from the height
    ax.set_xlabel("workers (processes x threads)")
    ax.set_ylabel("batches/s")
    ax.set_title(title or f"autotune: {tuning.tune_seconds:.1f} s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
