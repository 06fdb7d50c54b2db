"""How many tokens of small batches one gRPC message should carry: the same pipeline through
the real server at each `--message-tokens`, in paired rounds; prints a table and JSON.

  python scripts/bench/bench_message_size.py --builtin stdlib-docstrings [--batch-size 16
      --seq-len 1024] [--sizes 65536,262144] [--rounds 12]

Each round runs the pipeline in process once and then the server at every size, back to back
over a Unix socket; a size's figure is the median over rounds of its rate divided by the first
size's in the same round (this host's noise is per round), with the client's and server's CPU
per token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _arguments():
    from input_server.testing import corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--sizes",
        default="65536,262144",
        help="comma-separated --message-tokens to compare; the first is the base",
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--min-tokens", type=int, default=8_000_000)
    args = parser.parse_args()
    return args, corpus.corpus_from_arguments(parser, args)


def _rounds(spec, sizes: list[int], n: int) -> list[dict]:
    """Each round: the pipeline in process, then served at each message size."""
    from input_server.batching.parallelism import Parallelism, default_threads
    from input_server.benchmark import throughput
    from input_server.benchmark.served import bench_server

    rounds: list[dict] = []
    for r in range(n):
        ours = throughput.bench_pipeline(spec, Parallelism(0, default_threads(0)))
        row = {"in_process_tokens_per_s": ours["tokens_per_s"], "sizes": {}}
        for size in sizes:
            served = bench_server(spec, "unix", ("--message-tokens", str(size)))
            row["sizes"][size] = {
                k: served[k]
                for k in ("tokens_per_s", "client_cpu_ns_per_token", "server_cpu_ns_per_token")
            }
        rounds.append(row)
        print(
            f"[bench_message_size] round {r + 1}/{n}: "
            + ", ".join(
                f"{s}: {v['tokens_per_s'] / 1e6:.2f} M tokens/s" for s, v in row["sizes"].items()
            ),
            file=sys.stderr,
            flush=True,
        )
    return rounds


def _summary(sizes: list[int], rounds: list[dict]) -> dict:
    """Per size, the medians of the rounds' own ratios and CPU a token."""

    def median(size: int, key: str) -> float:
        return statistics.median(r["sizes"][size][key] for r in rounds)

    base = sizes[0]
    return {
        size: {
            "over_first_size": statistics.median(
                r["sizes"][size]["tokens_per_s"] / r["sizes"][base]["tokens_per_s"] for r in rounds
            ),
            "over_in_process": statistics.median(
                r["sizes"][size]["tokens_per_s"] / r["in_process_tokens_per_s"] for r in rounds
            ),
            "client_cpu_ns_per_token": median(size, "client_cpu_ns_per_token"),
            "server_cpu_ns_per_token": median(size, "server_cpu_ns_per_token"),
        }
        for size in sizes
    }


def main() -> int:
    from input_client import PipelineSpec
    from input_server.batching.grain_adapter import ensure_absl_flags_parsed
    from input_server.benchmark import throughput

    ensure_absl_flags_parsed()
    args, (jsonl, model) = _arguments()
    sizes = [int(s) for s in args.sizes.split(",")]
    spec = PipelineSpec(
        source={"paths": [jsonl]},
        tokenizer={"model": model},
        batch={"seq_len": args.seq_len, "size": args.batch_size},
        workers={"count": 0},
    )
    _, kept = throughput.epoch_token_counts(spec, throughput.corpus_texts(spec))
    spec = spec.replace(order={"epochs": max(1, -(-args.min_tokens // max(1, kept)))})
    rounds = _rounds(spec, sizes, args.rounds)
    result = {
        "batch": [args.batch_size, args.seq_len],
        "rounds": args.rounds,
        "sizes": _summary(sizes, rounds),
        "per_round": rounds,
    }
    print(
        f"{'message tokens':>14} {'/ first size':>12} {'/ in process':>12} "
        f"{'client ns/token':>15} {'server ns/token':>15}"
    )
    for size, v in result["sizes"].items():
        print(
            f"{size:>14} {v['over_first_size']:>12.3f} {v['over_in_process']:>12.3f} "
            f"{v['client_cpu_ns_per_token']:>15.1f} {v['server_cpu_ns_per_token']:>15.1f}"
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
