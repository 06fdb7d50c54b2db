"""Benchmark: "auto" tuned on the live stream against fixed worker counts, side by side.

    python scripts/bench/bench_online_tune.py [--out FILE.json] [--rounds 3] [--seconds 8]
        [--spec FILE.toml] [--only-unthrottled] [--before TREE] [--fixed PxT,...]

A real server (`input-server serve`, its own process) streams the standard library's
docstrings (~4 KB documents, a sentencepiece model trained on them; CPU-bound) to a client in
this process. Printed as JSON, ratios against fixed counts measured in the same run:

- first_batch: request to first batch on a fresh server, "auto" against the best fixed count
  (goal <= 1.5 x, and <= 2 s);
- restart: the same after a restart that found the choice remembered (goal <= 1.5 x);
- unthrottled: steady batches/s of a loop that takes all it gets, "auto" (after it settled)
  against the best fixed count (goal >= 0.95 x);
- throttled: a loop at ~5 batches/s: the workers "auto" chose against the fewest fixed ones
  that give 1.25 x its pace, and the server's CPU use against that count's (goal <= 1.3 x);
- demand_step: a loop at a third of one thread's rate, then 4 x faster (past what one thread
  makes): seconds until it gets what it asks for (0.95 x, in 1 s windows), and whether every
  batch equals a fixed count's;
- the run-ahead bound (sent - taken) and the reported demand against the loop's real pace.

With `--before TREE` (another checkout, e.g. `git worktree add /tmp/before HEAD`), a second
server runs that tree's code, and its "auto" streams are measured in the same rounds against
the same fixed counts (the unthrottled figures only): before and after side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bench_autotune import corpus  # scripts/bench/, beside this file

from input_client import InputClient, PipelineSpec
from input_server.autotune.measure import tree_cpu_seconds
from input_server.batching.grain_adapter import ensure_absl_flags_parsed
from input_server.serving.coalesce import MESSAGE_TOKENS, batches_per_message
from input_server.testing.results import emit_json

# The in-process counts, one process, and 2 processes with 1 and 2 threads: with a fast
# tokenizer backend the best fixed count may be any of them, so "best fixed" is honest.
FIXED = [(0, 1), (0, 2), (0, 4), (0, 8), (1, 1), (2, 1), (2, 2)]
PACE = 5.0
QUEUE_DEPTH, PREFETCH = 4, 2


BASE: PipelineSpec | None = None  # --spec: its source, tokenizer and batch instead


def spec_for(path: str, model: str, workers: dict, seed: int = 0) -> PipelineSpec:
    # `seed` makes a spec another spec (nothing remembered for it) without changing its cost.
    if BASE is not None:
        return BASE.replace(order={"epochs": 0, "shuffle": True, "seed": seed}, workers=workers)
    return PipelineSpec(
        source={"paths": [path]},
        tokenizer={"model": model},
        batch={"seq_len": 1024, "size": 8},
        order={"epochs": 0, "shuffle": True, "seed": seed},
        workers=workers,
    )


def fixed(p: int, t: int) -> dict:
    return {"count": p, "threads": t}


class Served:
    """`input-server serve` in its own process, on a Unix socket."""

    def __init__(self, directory: str, cache: str, tree: str | None = None):
        env = dict(os.environ)
        if tree:  # another checkout's server (--before)
            env["PYTHONPATH"] = os.pathsep.join([tree, os.path.join(tree, "client")])
        self.socket = os.path.join(directory, f"s{time.monotonic_ns()}.sock")
        roots = [directory]
        if BASE is not None:  # --spec: its files' folders
            roots += [os.path.dirname(p) for p in BASE.source.paths]
            roots.append(os.path.dirname(BASE.tokenizer.model.rstrip("/")))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "input_server.cli",
                "serve",
                "--listen",
                f"unix://{self.socket}",
                *[a for r in roots for a in ("--data-root", r)],
                "--tune-cache",
                cache,
                "--queue-depth",
                str(QUEUE_DEPTH),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=tree,  # `-m` puts the working folder first on sys.path: the tree's own
        )
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        self.client = InputClient(f"unix://{self.socket}", connect_timeout_s=30)

    def cpu_s(self) -> float:
        return tree_cpu_seconds(self.proc.pid)

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def first_batch_s(served: Served, spec: PipelineSpec) -> float:
    start = time.monotonic()
    with served.client.batches(spec, prefetch=PREFETCH) as it:
        next(it)
        return time.monotonic() - start


def idle(served: Served, timeout: float = 60.0) -> None:
    """Waits until the server's streams are gone: a closed stream's worker processes are the
    server's again only once it has torn down (a fixed count asking for them sooner is
    refused: RESOURCE_EXHAUSTED)."""
    deadline = time.monotonic() + timeout
    while served.client.info().streams and time.monotonic() < deadline:
        time.sleep(0.1)


def stream_info(served: Served):
    # The newest: a stream closed just before may still be listed while it tears down.
    return max(served.client.info().streams, key=lambda s: s.stream_id)


def take(
    it,
    seconds: float,
    pace: float = 0.0,
    record: list | None = None,
    windows: list | None = None,
) -> float:
    """Takes batches for `seconds` at `pace` (0 = as fast as they come); batches/s taken.
    `windows` gets the batches taken in each whole second."""
    start, n, marks = time.monotonic(), 0, []
    while time.monotonic() - start < seconds:
        batch = next(it)
        n += 1
        if record is not None:
            record.append(digest(batch))
        if windows is not None and time.monotonic() - start >= len(marks) + 1:
            marks.append(n)
        if pace:
            time.sleep(max(0.0, start + n / pace - time.monotonic()))
    if windows is not None:
        windows.extend(b - a for a, b in zip([0, *marks[:-1]], marks, strict=True))
    return n / (time.monotonic() - start)


def digest(batch) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        h.update(k.encode())
        h.update(batch[k].tobytes())
    return h.hexdigest()


def until_settled(
    served: Served, it, pace: float, timeout: float = 60.0, record: list | None = None
) -> float:
    start = time.monotonic()
    while stream_info(served).tuning_state != "settled":
        take(it, 0.5, pace, record)
        if time.monotonic() - start > timeout:
            raise RuntimeError("auto did not settle")
    return time.monotonic() - start


def steady_rate(
    served: Served,
    spec: PipelineSpec,
    seconds: float,
    pace: float = 0.0,
    windows: list | None = None,
):
    """(batches/s the loop took, server CPU cores, the stream's info) over `seconds` after
    warm-up (an "auto" stream: after it settled); `windows` gets its 1 s windows' rates."""
    idle(served)
    with served.client.batches(spec, prefetch=PREFETCH) as it:
        next(it)
        if spec.workers.count == "auto":
            until_settled(served, it, pace)
        take(it, 1.0, pace)
        cpu0, t0 = served.cpu_s(), time.monotonic()
        rate = take(it, seconds, pace, windows=windows)
        cpu = (served.cpu_s() - cpu0) / (time.monotonic() - t0)
        return rate, cpu, stream_info(served)


def first_seconds(served: Served, spec: PipelineSpec, seconds: float):
    """A fresh "auto" stream's first `seconds` from its first batch: (batches/s, seconds until
    it settled or None, what it did while searching: its 1 s windows' rates, the lowest over
    the first, the server's CPU seconds per batch)."""
    idle(served)
    with served.client.batches(spec, prefetch=PREFETCH) as it:
        next(it)
        start, n, settled, looked = time.monotonic(), 0, None, 0.0
        cpu0, marks, cpu_search, path = served.cpu_s(), [], None, []
        while time.monotonic() - start < seconds:
            next(it)
            n += 1
            now = time.monotonic()
            if settled is None and now - start >= len(marks) + 1:
                marks.append(n)  # batches taken by the end of each second while searching
            if settled is None and now - looked > 0.5:
                looked = now
                info = stream_info(served)
                if info.tuning_state == "settled":
                    settled = looked - start
                    cpu_search = (served.cpu_s() - cpu0, n)
                    path = [
                        f"{w.at_s:.1f}s {w.from_processes}x{w.from_threads}->"
                        f"{w.to_processes}x{w.to_threads}: {w.reason}"
                        for w in info.switches
                    ]
        rate = n / (time.monotonic() - start)
    rates = [b - a for a, b in zip([0, *marks[:-1]], marks, strict=True)]
    return (
        rate,
        settled,
        {
            "rates": rates,
            "min_over_start": min(rates) / rates[0] if len(rates) > 1 and rates[0] else None,
            "cpu_per_batch": cpu_search[0] / cpu_search[1] if cpu_search else None,
            "switches": path,
        },
    )


def unthrottled(args, d: str, path: str, model: str, seeds) -> dict:
    """Every fixed count and "auto" (fresh spec; with --before, the other tree's "auto" too),
    alternating, best of rounds; then fresh "auto" streams' first seconds."""
    trees = {"auto": None, **({"before": args.before} if args.before else {})}
    auto = {"count": "auto", "tune_seconds": 20}
    rates: dict[str, list[float]] = {}
    cpu_per_batch: dict[str, list[float]] = {}
    windows: dict[str, list[list[float]]] = {}
    choices: dict[str, list[str]] = {}
    firsts: dict[str, list[tuple]] = {}
    with contextlib.ExitStack() as stack:
        servers = {k: stack.enter_context(Served(d, "off", tree)) for k, tree in trees.items()}
        for _ in range(args.rounds):
            for p, t in FIXED:
                w: list[float] = []
                r, cpu, _ = steady_rate(
                    servers["auto"], spec_for(path, model, fixed(p, t)), args.seconds, windows=w
                )
                rates.setdefault(f"{p}x{t}", []).append(r)
                cpu_per_batch.setdefault(f"{p}x{t}", []).append(cpu / r)
                windows.setdefault(f"{p}x{t}", []).append(w)
            for k, served in servers.items():
                r, _, info = steady_rate(
                    served, spec_for(path, model, auto, next(seeds)), args.seconds
                )
                rates.setdefault(k, []).append(r)
                # The state at the end of the timed window: "searching" if it re-tuned then.
                choices.setdefault(k, []).append(
                    f"{info.worker_processes}x{info.worker_threads} ({info.tuning_state}): "
                    f"{info.worker_reason}"
                )
        # A fresh "auto" stream from its first batch: what the trainer gets while it
        # searches (and settles), and when it settled.
        for _ in range(args.rounds):
            for k, served in servers.items():
                spec = spec_for(path, model, auto, next(seeds))
                firsts.setdefault(k, []).append(first_seconds(served, spec, args.first_seconds))
    fixed_counts = [f"{p}x{t}" for p, t in FIXED]
    best_fixed = max(fixed_counts, key=lambda k: max(rates[k]))
    best_windows = windows[best_fixed]
    out = {
        "batches_per_s": {k: max(v) for k, v in rates.items()},
        "rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "best_fixed": best_fixed,
        "cpu_ms_per_batch": {
            k: round(1e3 * statistics.median(v), 3) for k, v in cpu_per_batch.items()
        },
        # The same statistic as the search's, for the best fixed count's own steady 1 s
        # windows (args.seconds of them a round): the loop's noise with nothing switching.
        "best_fixed_min_1s_over_first": [
            min(w) / w[0] if w and w[0] else None for w in best_windows
        ],
        "best_fixed_1s_rates": best_windows,
    }
    median_1s = statistics.median(x for w in best_windows for x in w)
    for k in trees:
        out[k] = auto_figures(
            k, rates, fixed_counts, best_fixed, firsts[k], choices[k], cpu_per_batch, median_1s
        )
        out[k]["first_seconds"] = args.first_seconds
    return out


def auto_figures(
    k, rates, fixed_counts, best_fixed, firsts, choices, cpu_per_batch, median_1s
) -> dict:
    """One tree's "auto" figures against the fixed counts of the same rounds."""
    # Per round: "auto" over the best fixed count of the same round; the median of those.
    per_round = [a / max(rates[f][i] for f in fixed_counts) for i, a in enumerate(rates[k])]
    best = max(rates[best_fixed])
    search = [seen for _, _, seen in firsts]
    return {
        "choices": choices,
        "over_best_fixed_best_rounds": max(rates[k]) / best,
        "over_best_fixed_median_round": statistics.median(per_round),
        "first_batches_per_s": [r for r, _, _ in firsts],
        "first_over_best_fixed": statistics.median(r for r, _, _ in firsts) / best,
        "settled_at_s": [s for _, s, _ in firsts],
        # While searching (first batch to settled), per round: the lowest 1 s window's rate
        # over the first window's (the opening parallelism's), and over the best fixed
        # count's median 1 s window; the server's CPU per batch over the best fixed count's
        # (its steady CPU per batch, median of rounds).
        "search_min_1s_over_start": [s["min_over_start"] for s in search],
        "search_min_1s_over_best_fixed_median_1s": [
            min(s["rates"]) / median_1s if s["rates"] else None for s in search
        ],
        "search_1s_rates": [s["rates"] for s in search],
        "search_switches": [s["switches"] for s in search],
        "search_cpu_per_batch_over_best_fixed": [
            s["cpu_per_batch"] / statistics.median(cpu_per_batch[best_fixed])
            for s in search
            if s["cpu_per_batch"]
        ],
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--spec",
        help="a spec TOML whose source, tokenizer and batch are measured instead of the "
        "docstrings with a sentencepiece model (e.g. a Llama 3 tiktoken pipeline)",
    )
    parser.add_argument(
        "--first-seconds",
        type=float,
        default=30.0,
        help='the window from a fresh "auto" stream\'s first batch whose rate is compared '
        "with the best fixed count (what the trainer gets while it searches)",
    )
    parser.add_argument(
        "--before",
        metavar="TREE",
        help='another checkout whose server\'s "auto" streams are measured beside this '
        "one's, in the same rounds (the unthrottled figures only)",
    )
    parser.add_argument(
        "--fixed",
        metavar="PxT,...",
        help="the fixed counts compared, processes x threads (default: "
        + ",".join(f"{p}x{t}" for p, t in FIXED)
        + "; a many-core host has more worth trying, e.g. 4x1,8x1)",
    )
    parser.add_argument(
        "--only-unthrottled",
        action="store_true",
        help="measure the unthrottled loop only (a quicker look)",
    )
    return parser.parse_args()


def first_batches(args, d: str, path: str, model: str, auto: dict, seeds, best: str) -> dict:
    """First batch on a fresh server and fresh spec; then after a restart that remembers."""
    bp, bt = map(int, best.split("x"))
    firsts: dict[str, list[float]] = {
        "auto": [],
        "fixed": [],
        "auto_restart": [],
        "fixed_restart": [],
    }
    for _ in range(args.rounds):
        cache = tempfile.mkdtemp(dir=d)
        spec = spec_for(path, model, auto, next(seeds))
        with Served(d, cache) as served:
            firsts["auto"].append(first_batch_s(served, spec))
            with served.client.batches(spec, prefetch=PREFETCH) as it:
                until_settled(served, it, 0.0)
        with Served(d, "off") as served:
            firsts["fixed"].append(first_batch_s(served, spec_for(path, model, fixed(bp, bt))))
        with Served(d, cache) as served:  # restarted: the choice is on disk
            firsts["auto_restart"].append(first_batch_s(served, spec))
        with Served(d, "off") as served:
            firsts["fixed_restart"].append(
                first_batch_s(served, spec_for(path, model, fixed(bp, bt), 0))
            )
    med = {k: statistics.median(v) for k, v in firsts.items()}
    return {
        **med,
        "auto_over_fixed": med["auto"] / med["fixed"],
        "restart_auto_over_fixed": med["auto_restart"] / med["fixed_restart"],
    }


def throttled(args, d: str, path: str, model: str, auto: dict, seeds, rates: dict) -> dict:
    """A loop at PACE: the choice, the CPU it costs, the bound, the demand."""
    need = 1.25 * PACE
    fewest = next(k for k in ("0x1", "0x2", "0x4", "2x1") if rates.get(k, 0.0) >= need)
    fp, ft = map(int, fewest.split("x"))
    with Served(d, "off") as served:
        # Twice the window: at a few batches a second the server uses ~2 % of a core.
        _, cpu_fixed, _ = steady_rate(
            served, spec_for(path, model, fixed(fp, ft)), 2 * args.seconds, PACE
        )
        rate, cpu_auto, info = steady_rate(
            served, spec_for(path, model, auto, next(seeds)), 2 * args.seconds, PACE
        )
    return {
        "pace": rate,
        "auto_choice": f"{info.worker_processes}x{info.worker_threads}",
        "fewest_fixed_meeting_1.25x": fewest,
        "server_cpu_cores_auto": cpu_auto,
        "server_cpu_cores_fixed": cpu_fixed,
        "cpu_auto_over_fixed": cpu_auto / cpu_fixed,
        "reported_demand": info.consumed_batches_per_s,
        "demand_error": abs(info.consumed_batches_per_s - rate) / rate,
    }


def demand_step(d: str, path: str, model: str, auto: dict, seeds, rates: dict) -> dict:
    """A third of one thread's rate, then 4 x: past what one thread makes; the batches
    against a fixed stream's, and how far the server ran ahead."""
    slow = rates["0x1"] / 3
    spec = spec_for(path, model, auto, next(seeds))
    got: list[str] = []
    # The bound: the server's queue, the client's prefetch and one message.
    ahead_max = 0
    bound = QUEUE_DEPTH + PREFETCH + batches_per_message(8, 1024, MESSAGE_TOKENS)
    with Served(d, "off") as served:
        with served.client.batches(spec, prefetch=PREFETCH) as it:
            got.append(digest(next(it)))
            until_settled(served, it, slow, record=got)
            before = stream_info(served)
            step_at, met_after, windows = time.monotonic(), None, []
            while time.monotonic() - step_at < 20:
                r = take(it, 1.0, 4 * slow, got)
                windows.append(r)
                s = stream_info(served)
                ahead_max = max(ahead_max, s.batches_sent - s.batches_taken)
                if met_after is None and r >= 0.95 * 4 * slow:
                    met_after = time.monotonic() - step_at
            after = stream_info(served)
    with Served(d, "off") as served:
        with served.client.batches(spec.replace(workers=fixed(0, 1)), prefetch=PREFETCH) as it:
            want = [digest(next(it)) for _ in range(len(got))]
    return {
        "slow_pace": slow,
        "fast_pace": 4 * slow,
        "choice_before": f"{before.worker_processes}x{before.worker_threads}",
        "choice_after": f"{after.worker_processes}x{after.worker_threads}",
        "met_after_s": met_after,
        "paces_taken": windows,
        "switches": [
            f"{w.at_s:.1f}s {w.from_processes}x{w.from_threads}->"
            f"{w.to_processes}x{w.to_threads}: {w.reason}"
            for w in after.switches
        ],
        "batches": len(got),
        "identical_to_fixed": got == want,
        "most_ahead": ahead_max,
        "ahead_bound": bound,
    }


def main() -> None:
    """The unthrottled rates, then (unless --only-unthrottled) first batches, a paced loop
    and a demand step, as JSON."""
    global BASE, FIXED
    args = parse_args()
    ensure_absl_flags_parsed()
    if args.fixed:
        FIXED = [tuple(map(int, c.split("x"))) for c in args.fixed.split(",")]
    if args.spec:
        BASE = PipelineSpec.from_toml(args.spec)
    with tempfile.TemporaryDirectory() as d:
        path, model = corpus(d)
        auto = {"count": "auto", "tune_seconds": 20}
        out: dict = {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv),
        }
        seeds = iter(range(1, 10_000))
        out["unthrottled"] = unthrottled(args, d, path, model, seeds)
        if not args.only_unthrottled:
            rates = out["unthrottled"]["batches_per_s"]
            best = out["unthrottled"]["best_fixed"]
            out["first_batch_s"] = first_batches(args, d, path, model, auto, seeds, best)
            out["throttled"] = throttled(args, d, path, model, auto, seeds, rates)
            out["demand_step"] = demand_step(d, path, model, auto, seeds, rates)
    emit_json(out, args.out)


if __name__ == "__main__":
    main()
