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
import tempfile


def main() -> int:
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags
    from input_client import PipelineSpec
    from input_server import bench, corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", help="jsonl file with a 'text' field")
    parser.add_argument("--model", help="sentencepiece model")
    parser.add_argument("--builtin", choices=sorted(corpus.BUILTIN_CORPORA))
    parser.add_argument("--vocab-size", type=int, default=1000,
                        help="vocabulary of the tokenizer trained for --builtin")
    # MaxText's default max_target_length, and rows for a small TPU host's share of a global
    # batch: 65,536 tokens a batch. gRPC's cost per message is mostly fixed, so smaller
    # batches pay more per token through the server (see README "Speed").
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--min-tokens", type=int, default=8_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    if args.builtin:
        work = tempfile.mkdtemp(prefix="bench-")
        args.corpus, args.model = corpus.build_builtin(args.builtin, work,
                                                       vocab_size=args.vocab_size)
    if not (args.corpus and args.model):
        parser.error("give --corpus and --model, or --builtin")
    spec = PipelineSpec(source={"paths": [args.corpus]}, tokenizer={"model": args.model},
                        batch={"seq_len": args.seq_len, "size": args.batch_size},
                        workers={"count": 0})
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
