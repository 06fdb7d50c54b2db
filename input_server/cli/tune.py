"""`input-server tune`: a spec's pipeline measured at candidate worker counts, with the
autotuner's choice, its reason and the keys that fix it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from input_client.spec import PipelineSpec
from input_server.plurals import plural


def register(subparsers) -> None:
    tune = subparsers.add_parser(
        "tune",
        help="measure a spec's pipeline at candidate worker counts "
        "and print the autotuner's choice",
    )
    tune.add_argument("spec", metavar="SPEC.toml", help="a pipeline spec file")
    tune.add_argument(
        "--max-workers",
        type=int,
        metavar="N",
        help="at most N workers (processes x threads); default the spec's "
        "workers.max_workers (0 = no cap)",
    )
    tune.add_argument(
        "--target-batches-per-s",
        type=float,
        metavar="R",
        help="the consumer's demand: choose the fewest workers that deliver it; "
        "default the spec's workers.target_batches_per_s (0 = unknown)",
    )
    tune.add_argument(
        "--tune-seconds",
        type=float,
        metavar="S",
        help="time bound; default the spec's workers.tune_seconds (20)",
    )
    tune.add_argument("--json", metavar="OUT", help="write the measurements and choice as JSON")
    tune.add_argument(
        "--plot",
        metavar="OUT.png",
        help="draw batches/s against workers, choice marked (needs matplotlib)",
    )


def run(args: argparse.Namespace) -> int:
    from input_server.autotune.measure import CLOSE_WAIT_S, wait_closed

    try:
        return _run(args)
    finally:
        # A candidate cut by the time limit may still be closing its stream (stopping Grain
        # worker processes it was starting): exiting now would leave that to Grain's
        # finalizers at interpreter exit, which print tracebacks and leak shared memory.
        if not wait_closed():
            print(
                "input-server: a candidate's worker processes did not stop within "
                f"{CLOSE_WAIT_S:.0f} s",
                file=sys.stderr,
            )


def _run(args: argparse.Namespace) -> int:
    from input_server.autotune import report
    from input_server.batching.pipeline import Pipeline
    from input_server.errors import InputServerError

    def fail(e: Exception) -> int:
        print(f"input-server: {e}", file=sys.stderr)
        return 2

    if args.plot:
        try:
            report.check_plotting()
        except ImportError as e:
            return fail(e)
    spec = _spec(args)
    try:
        tuning = _tune(Pipeline(spec))
    except InputServerError as e:
        return fail(e)
    _print_choice(tuning)
    if args.json:
        _write_json(tuning, args)
    if args.plot:
        try:
            report.plot(tuning, args.plot, title=os.path.basename(args.spec))
        except ImportError as e:
            return fail(e)
    return 0


def _spec(args: argparse.Namespace) -> PipelineSpec:
    """The spec file's, with the flags given over its `workers` keys."""
    spec = PipelineSpec.from_toml(args.spec)
    overrides = {
        k: v
        for k, v in (
            ("max_workers", args.max_workers),
            ("target_batches_per_s", args.target_batches_per_s),
            ("tune_seconds", args.tune_seconds),
        )
        if v is not None
    }
    # A bad flag is refused here (the spec validates itself), under its key, e.g.
    # `workers.max_workers`.
    return spec.replace(workers=overrides) if overrides else spec


def _tune(pipeline):
    """The offline search on `pipeline`, its progress on a bar that follows the clock."""
    from tqdm import tqdm

    from input_server.autotune import offline

    w = pipeline.spec.workers
    bar = tqdm(
        total=float(w.tune_seconds),
        desc="tuning",
        unit="s",
        disable=None,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.0f} s {postfix}",
    )
    done = threading.Event()
    start = time.perf_counter()

    def tick() -> None:  # the bar follows the clock, not only the candidates' ends
        while not done.wait(0.25):
            bar.n = min(bar.total, time.perf_counter() - start)
            bar.refresh()

    def progress(c, row) -> None:
        p = c.parallelism
        if row is None:
            bar.set_postfix_str(f"{p.processes} proc x {p.threads} thr ...")
        elif row.ran:
            bar.set_postfix_str(
                f"{p.processes} proc x {p.threads} thr: {row.batches_per_s:.1f} batches/s"
            )

    ticker = threading.Thread(target=tick, name="tune-progress", daemon=True)
    ticker.start()
    try:
        return offline.tune(
            pipeline,
            target_batches_per_s=float(w.target_batches_per_s),
            max_workers=w.max_workers,
            ram_budget_mb=w.ram_budget_mb,
            tune_seconds=float(w.tune_seconds),
            progress=progress,
        )
    finally:
        done.set()
        ticker.join()
        bar.close()


def _print_choice(tuning) -> None:
    """The table, the choice with its reason, and the keys that fix it."""
    from input_server.autotune import report
    from input_server.autotune.policy import cpu_count

    p = tuning.parallelism
    print(report.table(tuning))
    print(
        f"choice: {plural(p.processes, 'process', 'processes')} x "
        f"{plural(p.threads, 'thread')} ({plural(p.workers, 'worker')}), "
        f"{tuning.reason}: {tuning.detail}"
    )
    print(
        f"tuned in {tuning.tune_seconds:.1f} s on {cpu_count()} CPUs; set "
        f"`workers.count = {p.processes}` and `workers.threads = {p.threads}` to "
        f'fix this choice, or keep "auto".'
    )


def _write_json(tuning, args: argparse.Namespace) -> None:
    from input_server.autotune.policy import cpu_count

    with open(args.json, "w") as f:
        json.dump(
            {"spec": os.path.abspath(args.spec), "cpu_count": cpu_count(), **tuning.to_dict()},
            f,
            indent=2,
        )
