"""Fan-in and TLS side by side in one run; prints a table and JSON
(input_server/tools/bench_fanin.py says what is compared). Needs two cores and `taskset`.

  python scripts/bench_fanin.py --builtin pydoc-topics [--rounds 3] [--json OUT]
  python scripts/bench_fanin.py --corpus FILE.jsonl --model SPM.model
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags
    from input_server.tools import bench_fanin, corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--min-tokens", type=int, default=2_000_000)
    parser.add_argument(
        "--kind",
        default="sentencepiece",
        choices=("sentencepiece", "huggingface", "tiktoken"),
        help="the tokenizer (another than sentencepiece is trained on the corpus)",
    )
    parser.add_argument("--prefetch", type=int, default=2, help="the client's, per server")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    jsonl, model = corpus.corpus_from_arguments(parser, args)
    try:
        result = bench_fanin.run(
            jsonl,
            model,
            rounds=args.rounds,
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            min_tokens=args.min_tokens,
            prefetch=args.prefetch,
            kind=args.kind,
            say=lambda m: print(m, file=sys.stderr),
        )
    except RuntimeError as e:
        parser.exit(2, f"{parser.prog}: {e}\n")
    print(bench_fanin.format_table(result))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
