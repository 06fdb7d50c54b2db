"""`input-server bench`: a spec's throughput against the tokenizer's limit and a MaxText-style
Grain pipeline."""

from __future__ import annotations

import argparse
import json
import sys

from input_client.spec import PipelineSpec
from input_server.cli.arguments import positive


def _kinds(text: str) -> tuple[str, ...]:
    from input_server.tools.bench_kinds import parse_kinds

    try:
        return parse_kinds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"must be counts like 0,1,4, got {text!r}")
    return counts


def register(subparsers) -> None:
    bench = subparsers.add_parser(
        "bench",
        help="measure a spec's throughput against the tokenizer's "
        "limit and a MaxText-style Grain pipeline",
    )
    bench.add_argument("spec", help="pipeline spec TOML")
    bench.add_argument("--json", metavar="OUT", help="also write the result as JSON")
    bench.add_argument(
        "--min-tokens",
        type=positive(int),
        default=8_000_000,
        help="tokens each measured run delivers",
    )
    bench.add_argument(
        "--rounds",
        type=positive(int),
        help="rounds, each measuring everything back to back; a ratio is the "
        "median of the rounds' ratios, a rate the best round's (default 5; 3 with --kinds)",
    )
    bench.add_argument(
        "--kinds",
        type=_kinds,
        metavar="all|KIND,...",
        help="a row per tokenizer kind (sentencepiece, huggingface, tiktoken) on the spec's "
        "corpus: the spec's model for its kind, the others trained on the corpus with its "
        "vocabulary size; the server over a Unix socket only",
    )
    bench.add_argument(
        "--reference-processes",
        type=_counts,
        metavar="N,...",
        help="worker process counts to run the MaxText-style reference at, the best one "
        "compared (default 0,1,CORES)",
    )


def run(args: argparse.Namespace) -> int:
    from input_server.batching.pipeline import Pipeline
    from input_server.tools import bench, bench_rounds, bench_table

    spec = PipelineSpec.from_toml(args.spec)
    Pipeline(spec)  # missing files or model, a spec that does not fit the data: one line
    if args.kinds:
        from input_server.tools import bench_kinds

        result = bench.run_kinds(
            spec,
            args.kinds,
            min_tokens=args.min_tokens,
            rounds=args.rounds or 3,
            reference_processes=args.reference_processes,
        )
        print(bench_kinds.format_kinds_table(result))
    else:
        result = bench.run(
            spec,
            min_tokens=args.min_tokens,
            rounds=args.rounds or 5,
            reference_processes=args.reference_processes,
        )
        print(bench_table.format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    failed = bench_rounds.failures(result)
    if failed:  # the other rows' figures are printed and written: exit 1, not a traceback
        print(
            f"input-server: bench: {len(failed)} measurement(s) failed ({'; '.join(failed)}); "
            f"the others' figures are above" + (f" and in {args.json}." if args.json else "."),
            file=sys.stderr,
        )
        return 1
    return 0
