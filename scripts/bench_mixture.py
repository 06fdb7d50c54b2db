"""Mixtures and pre-tokenized data through a real server, side by side in one run; prints a
table and JSON (input_server/tools/bench_mixture.py says what is compared).

  python scripts/bench_mixture.py --builtin stdlib-docstrings [--components 40] [--json OUT]
  python scripts/bench_mixture.py --corpus FILE.jsonl --model SPM.model
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags
    from input_server.tools import bench_mixture, corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    parser.add_argument("--components", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--min-tokens", type=int, default=8_000_000, help="text streams' tokens (ids: 4x)"
    )
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    jsonl, model = corpus.corpus_from_arguments(parser, args)
    result = bench_mixture.run(
        jsonl,
        model,
        components=args.components,
        rounds=args.rounds,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        min_tokens=args.min_tokens,
        say=lambda m: print(m, file=sys.stderr),
    )
    print(bench_mixture.format_table(result))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
