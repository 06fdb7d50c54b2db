"""Throughput benchmark, side by side in one run; prints a table and JSON.

  python scripts/bench.py --corpus FILE.jsonl --model SPM.model [--json OUT]
  python scripts/bench.py --builtin stdlib-docstrings [--json OUT]   # corpus + model built here

Builtin corpora ship with Python, so the run is offline and repeatable: `stdlib-docstrings`
(many short documents) and `pydoc-topics` (few long ones).
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags
    from input_client import PipelineSpec
    from input_server.tools import bench, corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    # MaxText's default max_target_length, and rows for a small TPU host's share of a global
    # batch: 65,536 tokens a batch. gRPC's cost per message is mostly fixed, so smaller
    # batches pay more per token through the server (see README "Speed").
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--min-tokens", type=int, default=8_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    jsonl, model = corpus.corpus_from_arguments(parser, args)
    spec = PipelineSpec(
        source={"paths": [jsonl]},
        tokenizer={"model": model},
        batch={"seq_len": args.seq_len, "size": args.batch_size},
        workers={"count": 0},
    )
    result = bench.run(spec, min_tokens=args.min_tokens, rounds=args.rounds)
    print(bench.format_table(result))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
