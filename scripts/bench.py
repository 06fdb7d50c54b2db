"""Throughput benchmark, side by side in one run; prints a table and JSON.

  python scripts/bench.py --corpus FILE.jsonl --model SPM.model [--json OUT]
  python scripts/bench.py --builtin stdlib-docstrings [--json OUT]   # corpus + model built here
  python scripts/bench.py --builtin pydoc-topics --kinds all   # a row per tokenizer kind

Builtin corpora ship with Python, so the run is offline and repeatable: `stdlib-docstrings`
(many short documents) and `pydoc-topics` (few long ones). `--kinds` measures each tokenizer
kind on the corpus (models trained here with the sentencepiece model's vocabulary size).
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    from input_client import PipelineSpec
    from input_server.batching._grain import ensure_absl_flags_parsed
    from input_server.testing import corpus
    from input_server.tools import bench, bench_kinds, bench_table

    ensure_absl_flags_parsed()

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    # MaxText's default max_target_length, and rows for a small TPU host's share of a global
    # batch: 65,536 tokens a batch. gRPC's cost per message is mostly fixed, so smaller
    # batches pay more per token through the server (docs/benchmarks.md, "What `bench`
    # measures").
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--min-tokens", type=int, default=8_000_000)
    parser.add_argument("--rounds", type=int, help="default 5; 3 with --kinds")
    parser.add_argument(
        "--kinds", type=bench_kinds.parse_kinds, help="all, or kinds separated by commas"
    )
    parser.add_argument(
        "--reference-processes",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        help="worker processes of the MaxText-style reference runs (default 0,1,CORES)",
    )
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    jsonl, model = corpus.corpus_from_arguments(parser, args)
    spec = PipelineSpec(
        source={"paths": [jsonl]},
        tokenizer={"model": model},
        batch={"seq_len": args.seq_len, "size": args.batch_size},
        workers={"count": 0},
    )
    options = dict(min_tokens=args.min_tokens, reference_processes=args.reference_processes)
    if args.kinds:
        result = bench.run_kinds(spec, args.kinds, rounds=args.rounds or 3, **options)
        print(bench_kinds.format_kinds_table(result))
    else:
        result = bench.run(spec, rounds=args.rounds or 5, **options)
        print(bench_table.format_table(result))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
