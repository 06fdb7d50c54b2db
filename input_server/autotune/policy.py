"""Autotune policy: which candidate comes next offline and what to choose, as pure functions of
a table (what the live search measures next is `search.py`).

A "worker" is one document group being read and tokenized at a time: a candidate has
`max(1, processes) * threads` of them. Threads in the server process are the cheap knob
(no memory of their own; each group's sentencepiece call runs on its own C++ threads, and a
thread waiting on remote storage costs no CPU); processes pay off when per-record Python work
holds the GIL, so they are tried only when the in-process candidates leave cores idle or fall
short of the target. `next_candidate` (what to run next), `decide` (what to choose),
`contenders` (what to look at twice) and `pool` are pure, so the policy is testable on
synthetic tables as well as on real runs (`measure` makes the rows, `tuner` runs the loop).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

from input_server.autotune.reasons import plateau_words

# Module-level alias so tests can pretend another host (a pure decision's inputs, like
# Grain's `pick_performance_config`).
cpu_count = os.cpu_count

# A step to more workers must add at least this much to count as progress ("a few percent");
# the choice is then within this fraction of the best rate measured.
PLATEAU_GAIN = 0.05
# Choosing among measured candidates: the cheapest within this of the fastest. Tighter than
# the search's plateau, since a candidate a little slower in a noisy window may be much slower
# in truth (docs/benchmarks.md, "Autotune"), and an in-process thread costs no memory.
CHOICE_GAIN = 0.02
# With a target, the choice must measure this much above it, so the jitter of a shared host
# (and of the consumer) does not starve the trainer.
TARGET_HEADROOM = 1.25
# Threads per process: latency-bound sources want many; past this, use processes.
MAX_THREADS = 128
# More workers than cores must gain this much: past the cores, extra threads only pay for
# waiting (remote storage gains far more a doubling); a CPU-bound gain that small is within the
# noise of a shared host, and oversubscribing the cores takes CPU from the trainer.
OVERSUBSCRIBE_GAIN = 0.2
# Below the core count, one step that gains nothing (noise on a busy host) does not end the
# thread search; a second one does. Past the cores, or for processes (a spawn each), one does.
THREAD_PATIENCE = 2
# After the search, the choice and the candidates within this band of it (and, when it has
# more workers than cores, the best within the cores) are measured once more, side by side,
# and decided on both windows: one window on a busy host is noisy (docs/benchmarks.md,
# "Autotune").
CONFIRM_BAND = 0.15
CONFIRM_MAX = 2
# Processes are tried when the in-process candidates keep fewer than this share of the cores
# busy: their per-record Python work (and the packer, in the server) holds the GIL.
GIL_BOUND_SHARE = 0.9
TUNE_SECONDS = 20.0
# Why a candidate was skipped when the server's free worker processes could not run it.
SERVER_CAP = "server's max workers"
REASONS = ("target met", "plateau", "ram cap", "max workers", "time limit", "fastest")


def workers_of(processes: int, threads: int) -> int:
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
        return workers_of(self.processes, self.threads)

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
        return {
            **dataclasses.asdict(self),
            "workers": self.workers,
            "rss_mb_per_worker": self.rss_mb_per_worker,
        }


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
        return workers_of(self.processes, self.threads)

    @property
    def chosen(self) -> Measurement:
        """The measurement of the chosen candidate."""
        return next(
            m
            for m in self.measurements
            if m.ran and (m.processes, m.threads) == (self.processes, self.threads)
        )

    def summary(self) -> str:
        """One line for logs and `StreamInfo.worker_reason`."""
        return (
            f"{self.processes} process{'' if self.processes == 1 else 'es'} x {self.threads} "
            f"thread{'' if self.threads == 1 else 's'} ({self.reason}: "
            f"{self.detail}; {sum(m.ran for m in self.measurements)} candidates measured "
            f"in {self.tune_seconds:.1f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["measurements"] = [m.to_dict() for m in self.measurements]
        d["workers"] = self.workers
        if math.isinf(self.ram_budget_mb):
            d["ram_budget_mb"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tuning:
        """The inverse of `to_dict` (derived fields dropped).

        Raises:
          TypeError, ValueError, KeyError: `d` is not a tuning's dict.
        """
        fields = {f.name for f in dataclasses.fields(Measurement)}
        measurements = tuple(
            Measurement(**{k: v for k, v in m.items() if k in fields}) for m in d["measurements"]
        )
        keep = {f.name for f in dataclasses.fields(cls)} - {"measurements"}
        values = {k: v for k, v in d.items() if k in keep}
        if values.get("ram_budget_mb") is None:
            values["ram_budget_mb"] = math.inf
        return cls(measurements=measurements, **values)


def si_units(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"


def cost(m: Measurement) -> tuple[int, int]:
    # In-process threads before any process (no spawn, no copies, no per-process memory),
    # then fewer before more.
    return (m.processes, m.threads)


# --- Deciding -------------------------------------------------------------------------------


def over_cap(workers: int, rss_mb: float, *, max_workers: int, ram_budget_mb: float) -> str:
    """Why a candidate of `workers` that adds `rss_mb` is out: "max workers", "ram cap", or ""
    when it fits. The one cap check, for measured rows and for candidates not yet run."""
    if max_workers and workers > max_workers:
        return "max workers"
    return "ram cap" if rss_mb > ram_budget_mb else ""


def decide(
    measurements: Sequence[Measurement],
    *,
    ram_budget_mb: float = math.inf,
    target_batches_per_s: float = 0.0,
    max_workers: int = 0,
    cpus: int | None = None,
    oversubscribe_gain: float = OVERSUBSCRIBE_GAIN,
) -> Tuning:
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
      oversubscribe_gain: what more workers than cores must gain to count (the online search,
        whose loop is waiting for data, asks less: `online.ONLINE_OVERSUBSCRIBE_GAIN`).

    Returns:
      The `Tuning` (its `tune_seconds` is left 0 for the caller to fill).

    Raises:
      ValueError: no candidate was measured.
    """
    ran = sorted((m for m in measurements if m.ran), key=cost)
    if not ran:
        raise ValueError(
            "no candidate was measured; give the tuning more time (`workers.tune_seconds`)."
        )
    common = dict(
        measurements=tuple(measurements),
        target_batches_per_s=target_batches_per_s,
        ram_budget_mb=ram_budget_mb,
        max_workers=max_workers,
    )

    def why_out(m: Measurement) -> str:
        return over_cap(m.workers, m.rss_mb, max_workers=max_workers, ram_budget_mb=ram_budget_mb)

    fits = [m for m in ran if not why_out(m)]
    if not fits:
        least = min(ran, key=lambda m: (m.workers, m.rss_mb))
        return Tuning(
            processes=least.processes,
            threads=least.threads,
            reason=why_out(least) or "ram cap",
            detail=f"no candidate fits (ram_budget_mb={ram_budget_mb:g}, "
            f"max_workers={max_workers}); the smallest, {least.label()}, "
            f"adds {least.rss_mb:.0f} MiB",
            **common,
        )
    best = max(fits, key=lambda m: m.batches_per_s)
    if target_batches_per_s > 0:
        need = TARGET_HEADROOM * target_batches_per_s
        meeting = [m for m in fits if m.batches_per_s >= need]
        if meeting:
            c, h = meeting[0], TARGET_HEADROOM
            return Tuning(
                processes=c.processes,
                threads=c.threads,
                reason="target met",
                detail=f"the fewest workers ({c.workers}) that give {h:g} x the "
                f"target {target_batches_per_s:g} batches/s: "
                f"{c.batches_per_s:.1f} batches/s (best measured "
                f"{best.batches_per_s:.1f})",
                **common,
            )
    cpus = cpus or cpu_count() or 1
    inside = [m for m in fits if m.workers <= cpus] or fits
    best_in = max(inside, key=lambda m: m.batches_per_s)
    pool = fits if best.batches_per_s > (1 + oversubscribe_gain) * best_in.batches_per_s else inside
    best = max(pool, key=lambda m: m.batches_per_s)
    c = next(m for m in pool if m.batches_per_s * (1 + CHOICE_GAIN) >= best.batches_per_s)
    rate = f"{c.batches_per_s:.1f} batches/s, {si_units(c.tokens_per_s)} tokens/s"
    # Why nothing beyond the choice: a cap or the time bound cut a search still gaining, or
    # the rate stopped growing.
    faster_out = [
        m for m in ran if why_out(m) and m.batches_per_s > (1 + PLATEAU_GAIN) * c.batches_per_s
    ]
    cut = [m.skipped for m in measurements if m.skipped and cost(m) > cost(c)]
    if faster_out:
        reason = why_out(faster_out[0])
        detail = (
            f"{rate}; {faster_out[0].label()} was faster "
            f"({faster_out[0].batches_per_s:.1f}) but over the {reason}"
        )
    elif any(cost(m) > cost(c) for m in fits):
        reason = "plateau"
        more, beyond = [m for m in pool if cost(m) > cost(c)], [m for m in fits if m not in pool]
        gains = (CHOICE_GAIN, oversubscribe_gain)
        detail = f"{rate}; {plateau_words(c, more, beyond, cpus=cpus, gains=gains)}"
    elif cut:
        reason = cut[0]
        detail = f"{rate}; the {reason} stopped a search that was still gaining"
    else:
        reason = "fastest"
        detail = f"{rate}; the fastest of every candidate tried"
    if target_batches_per_s > 0:
        detail += (
            f"; the target {target_batches_per_s:g} batches/s (x {TARGET_HEADROOM:g} "
            f"headroom) was not reached"
        )
    return Tuning(processes=c.processes, threads=c.threads, reason=reason, detail=detail, **common)


def contenders(
    measurements: Sequence[Measurement], tuning: Tuning, *, cpus: int
) -> list[Measurement]:
    """The candidates one more window might show to be the better choice. Pure.

    For "target met": cheaper candidates within CONFIRM_BAND below the needed rate. Otherwise:
    candidates whose rate is within CONFIRM_BAND of the choice's, the nearest CONFIRM_MAX, and
    when the choice has more workers than `cpus`, the fastest within the cores (the
    comparison that let it oversubscribe them).
    """
    c = tuning.chosen
    fits = [
        m
        for m in measurements
        if m.ran
        and m is not c
        and not over_cap(
            m.workers, m.rss_mb, max_workers=tuning.max_workers, ram_budget_mb=tuning.ram_budget_mb
        )
    ]
    if tuning.reason == "target met":
        need = TARGET_HEADROOM * tuning.target_batches_per_s
        close = [
            m for m in fits if cost(m) < cost(c) and m.batches_per_s * (1 + CONFIRM_BAND) >= need
        ]
        key = lambda m: need - m.batches_per_s  # noqa: E731
    else:
        close = [
            m
            for m in fits
            if abs(m.batches_per_s - c.batches_per_s) <= CONFIRM_BAND * c.batches_per_s
        ]
        key = lambda m: abs(m.batches_per_s - c.batches_per_s)  # noqa: E731
        inside = [m for m in fits if m.workers <= cpus]
        if c.workers > cpus and inside:
            best_in = max(inside, key=lambda m: m.batches_per_s)
            return [best_in, *[m for m in sorted(close, key=key) if m is not best_in]][:CONFIRM_MAX]
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
        a,
        batches_per_s=mean(a.batches_per_s, b.batches_per_s),
        tokens_per_s=mean(a.tokens_per_s, b.tokens_per_s),
        rss_mb=max(a.rss_mb, b.rss_mb),
        cpu_cores=mean(a.cpu_cores, b.cpu_cores),
        startup_s=max(a.startup_s, b.startup_s),
        seconds=seconds,
        batches=a.batches + b.batches,
        samples=a.samples + b.samples,
    )
