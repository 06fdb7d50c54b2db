"""Benchmark: the autotuner against an exhaustive sweep and Grain's pick_performance_config.

    python scripts/bench/bench_autotune.py [--out FILE.json] [--delay-ms 5] [--rounds 2]

Two pipelines over the same real text (the standard library's docstrings joined into ~4 KB
documents, a sentencepiece model trained on them): CPU-bound (a plain jsonl file in the page
cache) and latency-bound (the same documents behind a source that sleeps `--delay-ms` per
record, standing in for remote storage). For each: `autotune.tune` picks (processes, threads)
and reports its tuning time; then every configuration of a grid, the autotuner's choice and
Grain's choice are measured side by side in interleaved rounds (the best window of each, since
other work on the host only slows a window down). Printed as JSON: the chosen / best ratio
(goal >= 0.95), the tuning seconds and the chosen / Grain ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile

from input_client import PipelineSpec
from input_server import autotune
from input_server.batching.grain_adapter import ensure_absl_flags_parsed
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline
from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl
from input_server.data.tokenizers.trainers import train_sentencepiece
from input_server.testing import SlowPipeline
from input_server.testing.results import emit_json

DOC_CHARS = 4000


def corpus(directory: str) -> tuple[str, str]:
    docs = stdlib_docstrings()
    joined, part = [], []
    for doc in docs:
        part.append(doc)
        if sum(map(len, part)) >= DOC_CHARS:
            joined.append("\n\n".join(part))
            part = []
    path = write_jsonl(joined, os.path.join(directory, "docs.jsonl"))
    return path, train_sentencepiece(docs, os.path.join(directory, "spm"), vocab_size=1000)


def grid(cpus: int, latency: bool) -> list[Parallelism]:
    threads = [2**i for i in range(8 if latency else 4)]  # 1..128 or 1..8
    configs = [Parallelism(0, t) for t in threads]
    for p in sorted({1, 2, cpus, 2 * cpus}):
        configs += [Parallelism(p, t) for t in sorted({1, max(1, 32 // p)} if latency else {1})]
    return configs


def bench(
    name: str, pipeline: Pipeline, configs: list[Parallelism], rounds: int, tune_seconds: float
) -> dict:
    print(f"[{name}] tuning ...", file=sys.stderr, flush=True)
    tuning = autotune.tune(
        pipeline, ram_budget_mb=pipeline.spec.workers.ram_budget_mb, tune_seconds=tune_seconds
    )
    print(autotune.table(tuning), file=sys.stderr, flush=True)
    choice = tuning.parallelism
    grain = autotune.grain_choice(pipeline)
    configs = list(dict.fromkeys([*configs, choice, grain]))
    best: dict[Parallelism, autotune.Measurement] = {}
    windows: dict[Parallelism, list[float]] = {c: [] for c in configs}
    for r in range(rounds):
        for c in configs:
            print(
                f"[{name}] round {r + 1}/{rounds}: {c.processes} processes x {c.threads} threads",
                file=sys.stderr,
                flush=True,
            )
            m = autotune.measure(pipeline, c)
            if m is not None:
                windows[c].append(round(m.batches_per_s, 1))
                if c not in best or m.batches_per_s > best[c].batches_per_s:
                    best[c] = m
    top = max(best.values(), key=lambda m: m.batches_per_s)

    def entry(c: Parallelism) -> dict:
        m = best[c]
        return {
            **c.to_dict(),
            "workers": c.workers,
            "batches_per_s": round(m.batches_per_s, 2),
            "tokens_per_s": round(m.tokens_per_s),
            "rss_mb_per_worker": round(m.rss_mb_per_worker, 1),
            "cpu_cores": round(m.cpu_cores, 2),
            "windows_batches_per_s": windows[c],
        }

    # How much one configuration's windows differ across rounds: the host's noise, against
    # which the ratios are to be read.
    spreads = sorted(1 - min(w) / max(w) for w in windows.values() if len(w) > 1)

    return {
        "sweep": [entry(c) for c in configs],
        "best": entry(top.parallelism),
        "auto": {
            **entry(choice),
            "reason": tuning.reason,
            "detail": tuning.detail,
            "tune_seconds": round(tuning.tune_seconds, 2),
            "candidates_measured": sum(m.ran for m in tuning.measurements),
        },
        "grain_pick_performance_config": entry(grain),
        "auto_over_best": round(best[choice].batches_per_s / top.batches_per_s, 3),
        "auto_over_grain": round(best[choice].batches_per_s / best[grain].batches_per_s, 3),
        "median_window_spread": round(spreads[len(spreads) // 2], 3) if spreads else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument(
        "--delay-ms", type=float, default=5.0, help="per-record latency of the latency-bound source"
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved sweep rounds")
    parser.add_argument("--tune-seconds", type=float, default=autotune.TUNE_SECONDS)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    ensure_absl_flags_parsed()
    cpus = autotune.cpu_count() or 1
    result = {
        "host": {
            "cpus": cpus,
            "python": platform.python_version(),
            "load_average_at_start": os.getloadavg(),
        },
        "settings": {
            "delay_ms": args.delay_ms,
            "rounds": args.rounds,
            "tune_seconds": args.tune_seconds,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "doc_chars": DOC_CHARS,
        },
    }
    with tempfile.TemporaryDirectory(prefix="bench-autotune-") as tmp:
        print("building the corpus and tokenizer ...", file=sys.stderr, flush=True)
        docs, model = corpus(tmp)
        spec = PipelineSpec(
            source={"paths": [docs]},
            tokenizer={"model": model},
            batch={"seq_len": args.seq_len, "size": args.batch_size},
            order={"epochs": 0},
        )
        cpu = Pipeline(spec)
        slow = SlowPipeline(spec, delay_s=args.delay_ms / 1000)
        result["cpu_bound"] = bench(
            "cpu-bound", cpu, grid(cpus, False), args.rounds, args.tune_seconds
        )
        result["latency_bound"] = bench(
            "latency-bound", slow, grid(cpus, True), args.rounds, args.tune_seconds
        )
    result["host"]["load_average_at_end"] = os.getloadavg()
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
