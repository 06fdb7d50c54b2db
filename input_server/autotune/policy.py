"""Autotune policy: what to choose from a table of measured candidates, as pure functions.

A "worker" is one document group being read and tokenized at a time (`Parallelism.workers`).
Threads in the server process are the cheap knob (no memory of their own; each group's
tokenizer call runs outside the GIL, and a thread waiting on remote storage costs no CPU);
processes pay off when per-record Python work holds the GIL. `decide` (what to choose),
`contenders` (what to measure twice) and `pool` (two windows as one) are pure, so the policy is
testable on synthetic tables as well as on real runs. What to measure next is `search`; the
rows come from `measure` (offline) or a live stream's windows (`online`); the offline search
runs in `offline`, the online one in `online`, and both decide here.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from input_server.autotune.measurements import Measurement, Tuning, si_units
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
# ...and when the host's idle cores could pay for them. A process's batch costs more CPU than
# a thread's (a copy of every group, an interpreter each): 1.15-1.35 x on the docstrings with
# sentencepiece, 1.3-2 x on Llama 3 and Qwen3 with fastokens (`bench_online_tune.py`,
# `cpu_ms_per_batch`). So processes can gain PLATEAU_GAIN only where the server's busy cores
# plus the host's idle ones (every process counted: the loop's, a trainer's) come to
# PROCESS_CPU_COST x (1 + PLATEAU_GAIN) x the server's. Where they do not, spawning them is
# all cost: 2 processes on 2 cores busy with client and server stalled the stream ~2 s and then
# gave 20 % fewer batches than 4 threads (docs/benchmarks.md, "The live search on fast
# tokenizers").
PROCESS_CPU_COST = 1.2
TUNE_SECONDS = 20.0
# Why a candidate was skipped when the server's free worker processes could not run it.
SERVER_CAP = "server's max workers"
REASONS = ("target met", "plateau", "ram cap", "max workers", "time limit", "fastest")


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
    measured memory (`measure.added_bytes`) exceeds `ram_budget_mb` are out. "Cheapest"
    orders in-process threads before processes, then by count.

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
    ran = sorted((m for m in measurements if m.ran), key=lambda m: m.parallelism)
    if not ran:
        raise ValueError(
            "no candidate was measured; give the tuning more time (`workers.tune_seconds`)."
        )
    caps = dict(max_workers=max_workers, ram_budget_mb=ram_budget_mb)
    common = dict(measurements=tuple(measurements), target_batches_per_s=target_batches_per_s)
    fits = [m for m in ran if not why_out(m, **caps)]
    if not fits:
        least = min(ran, key=lambda m: (m.parallelism.workers, m.rss_mb))
        return Tuning(
            parallelism=least.parallelism,
            reason=why_out(least, **caps) or "ram cap",
            detail=f"no candidate fits (ram_budget_mb={ram_budget_mb:g}, "
            f"max_workers={max_workers}); the smallest, {least.parallelism}, "
            f"adds {least.rss_mb:.0f} MiB",
            **common,
            **caps,
        )
    if target_batches_per_s > 0:
        met = _target_met(fits, target_batches_per_s)
        if met is not None:
            return Tuning(
                parallelism=met[0].parallelism, reason="target met", detail=met[1], **common, **caps
            )
    cpus = cpus or cpu_count() or 1
    c, pool = _plateau(fits, cpus=cpus, oversubscribe_gain=oversubscribe_gain)
    reason, detail = _why_no_more(
        c, measurements, ran, fits, pool, cpus=cpus, oversubscribe_gain=oversubscribe_gain, **caps
    )
    if target_batches_per_s > 0:
        detail += (
            f"; the target {target_batches_per_s:g} batches/s (x {TARGET_HEADROOM:g} "
            f"headroom) was not reached"
        )
    return Tuning(parallelism=c.parallelism, reason=reason, detail=detail, **common, **caps)


def why_out(m: Measurement, *, max_workers: int, ram_budget_mb: float) -> str:
    """`over_cap` of a measured row."""
    return over_cap(
        m.parallelism.workers, m.rss_mb, max_workers=max_workers, ram_budget_mb=ram_budget_mb
    )


def _target_met(fits: Sequence[Measurement], target: float) -> tuple[Measurement, str] | None:
    """The cheapest of `fits` (cheapest first) that gives TARGET_HEADROOM x `target`, and the
    sentence that says so; None when none does."""
    need, h = TARGET_HEADROOM * target, TARGET_HEADROOM
    c = next((m for m in fits if m.batches_per_s >= need), None)
    if c is None:
        return None
    best = max(fits, key=lambda m: m.batches_per_s)
    return c, (
        f"the fewest workers ({c.parallelism.workers}) that give {h:g} x the target "
        f"{target:g} batches/s: {c.batches_per_s:.1f} batches/s (best measured "
        f"{best.batches_per_s:.1f})"
    )


def _plateau(
    fits: Sequence[Measurement], *, cpus: int, oversubscribe_gain: float
) -> tuple[Measurement, list[Measurement]]:
    """The cheapest of `fits` within CHOICE_GAIN of the fastest, and the rows it was chosen
    from: those within the cores, unless the best beyond them gains `oversubscribe_gain`."""
    inside = [m for m in fits if m.parallelism.workers <= cpus] or list(fits)
    best = max(fits, key=lambda m: m.batches_per_s)
    best_in = max(inside, key=lambda m: m.batches_per_s)
    oversubscribe = best.batches_per_s > (1 + oversubscribe_gain) * best_in.batches_per_s
    pool = list(fits) if oversubscribe else inside
    best = max(pool, key=lambda m: m.batches_per_s)
    c = next(m for m in pool if m.batches_per_s * (1 + CHOICE_GAIN) >= best.batches_per_s)
    return c, pool


def _why_no_more(
    c: Measurement,
    measurements: Sequence[Measurement],
    ran: Sequence[Measurement],
    fits: Sequence[Measurement],
    pool: Sequence[Measurement],
    *,
    cpus: int,
    oversubscribe_gain: float,
    **caps,
) -> tuple[str, str]:
    """The reason and its sentence for choosing `c` (by `_plateau`) and nothing beyond it: a
    cap or the time bound cut a search still gaining, or the rate stopped growing."""
    rate = f"{c.batches_per_s:.1f} batches/s, {si_units(c.tokens_per_s)} tokens/s"
    faster_out = [
        m
        for m in ran
        if why_out(m, **caps) and m.batches_per_s > (1 + PLATEAU_GAIN) * c.batches_per_s
    ]
    cut = [m.skipped for m in measurements if m.skipped and m.parallelism > c.parallelism]
    if faster_out:
        reason = why_out(faster_out[0], **caps)
        return reason, (
            f"{rate}; {faster_out[0].parallelism} was faster "
            f"({faster_out[0].batches_per_s:.1f}) but over the {reason}"
        )
    if any(m.parallelism > c.parallelism for m in fits):
        more = [m for m in pool if m.parallelism > c.parallelism]
        beyond = [m for m in fits if m not in pool]
        gains = (CHOICE_GAIN, oversubscribe_gain)
        return "plateau", f"{rate}; {plateau_words(c, more, beyond, cpus=cpus, gains=gains)}"
    if cut:
        return cut[0], f"{rate}; the {cut[0]} stopped a search that was still gaining"
    return "fastest", f"{rate}; the fastest of every candidate tried"


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
    caps = dict(max_workers=tuning.max_workers, ram_budget_mb=tuning.ram_budget_mb)
    fits = [m for m in measurements if m.ran and m is not c and not why_out(m, **caps)]
    if tuning.reason == "target met":
        need = TARGET_HEADROOM * tuning.target_batches_per_s
        close = [
            m
            for m in fits
            if m.parallelism < c.parallelism and m.batches_per_s * (1 + CONFIRM_BAND) >= need
        ]
        key = lambda m: need - m.batches_per_s  # noqa: E731
    else:
        close = [
            m
            for m in fits
            if abs(m.batches_per_s - c.batches_per_s) <= CONFIRM_BAND * c.batches_per_s
        ]
        key = lambda m: abs(m.batches_per_s - c.batches_per_s)  # noqa: E731
        inside = [m for m in fits if m.parallelism.workers <= cpus]
        if c.parallelism.workers > cpus and inside:
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
