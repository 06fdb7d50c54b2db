"""Autotune reports: the measurement table, the `WorkerTuning` message, the plot."""

from __future__ import annotations

from input_client.proto import pb
from input_server.autotune.measurements import Measurement, Tuning, si_units


def table(tuning: Tuning) -> str:
    """The measurements as a text table; the choice is marked with `*`."""
    lines = [
        f"  {'workers':>7} {'processes':>9} {'threads':>7} {'batches/s':>10} "
        f"{'tokens/s':>10} {'MB/worker':>11} {'CPU cores':>9} {'start s':>7}"
    ]
    for m in tuning.measurements:
        p = m.parallelism
        chosen = m.ran and p == tuning.parallelism
        if m.ran:
            rates = f"{m.batches_per_s:>10.1f} {si_units(m.tokens_per_s):>10}"
            tail = f" {m.cpu_cores:>9.2f} {m.startup_s:>7.2f}"
        else:
            rates = f"{'-':>10} {'-':>10}"
            tail = f"  skipped: {m.skipped}"
        lines.append(
            f"{'*' if chosen else ' '} {p.workers:>7} {p.processes:>9} {p.threads:>7} "
            f"{rates} {m.rss_mb_per_worker:>7.1f} MiB{tail}"
        )
    return "\n".join(lines)


def measurement_proto(m: Measurement) -> pb.WorkerMeasurement:
    return pb.WorkerMeasurement(
        processes=m.parallelism.processes,
        threads=m.parallelism.threads,
        batches_per_s=m.batches_per_s,
        tokens_per_s=m.tokens_per_s,
        rss_mb_per_worker=m.rss_mb_per_worker,
        cpu_cores=m.cpu_cores,
        startup_s=m.startup_s,
        skipped=m.skipped,
    )


def tuning_proto(tuning: Tuning) -> pb.WorkerTuning:
    """The `WorkerTuning` message the info RPC reports."""
    return pb.WorkerTuning(
        reason=tuning.reason,
        measurements=[measurement_proto(m) for m in tuning.measurements],
        processes=tuning.parallelism.processes,
        threads=tuning.parallelism.threads,
        target_batches_per_s=tuning.target_batches_per_s,
        tune_seconds=tuning.tune_seconds,
    )


def check_plotting() -> None:
    """Raises ImportError naming the fix when matplotlib is missing (checked before a run
    that would end in a plot)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from e


def plot(tuning: Tuning, path: str, *, title: str = "") -> None:
    """Draws batches/s against workers, in-process and per process count, choice marked.

    Raises:
      ImportError: matplotlib is not installed (`pip install matplotlib`).
    """
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ran = [m for m in tuning.measurements if m.ran]
    for processes in sorted({m.parallelism.processes for m in ran}):
        pts = [m for m in ran if m.parallelism.processes == processes]
        pts.sort(key=lambda m: m.parallelism.workers)
        label = (
            "in-process threads"
            if processes == 0
            else f"{processes} process{'' if processes == 1 else 'es'}"
        )
        workers = [m.parallelism.workers for m in pts]
        ax.plot(workers, [m.batches_per_s for m in pts], "o-", label=label)
    c = next((m for m in ran if m.parallelism == tuning.parallelism), None)
    if c is not None:  # else nothing was measured in time: the default ran unmeasured
        ax.plot(
            [c.parallelism.workers],
            [c.batches_per_s],
            "r*",
            markersize=16,
            clip_on=False,  # at the top of the axes, the whole star still shows
            label=f"choice: {c.parallelism} ({tuning.reason})",
        )
    if tuning.target_batches_per_s:
        ax.axhline(tuning.target_batches_per_s, color="gray", linestyle="--", label="target")
    ax.set_xscale("log", base=2)
    # Ticks at the worker counts measured, as integers ("1 2 4", not "1.0 2.0 4.0").
    ticks = sorted({m.parallelism.workers for m in ran})
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    top = max([m.batches_per_s for m in ran] + [tuning.target_batches_per_s], default=0)
    # Ratios read true from the height; headroom above the highest point for the star.
    ax.set_ylim(bottom=0, top=top * 1.15 or 1.0)
    ax.set_xlabel("workers (processes x threads)")
    ax.set_ylabel("batches/s")
    ax.set_title(title or f"autotune: {tuning.tune_seconds:.1f} s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def switch_proto(s) -> pb.WorkerSwitch:
    """One `serving.retune.Switch` as `StreamInfo.switches` carries it."""
    return pb.WorkerSwitch(
        at_s=s.at_s,
        from_processes=s.before.processes,
        from_threads=s.before.threads,
        to_processes=s.after.processes,
        to_threads=s.after.threads,
        reason=s.reason,
        capacity_batches_per_s=s.capacity,
        demand_batches_per_s=s.demand,
    )
