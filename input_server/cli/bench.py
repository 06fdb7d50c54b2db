"""`input-server bench`: a spec's throughput (or a builtin corpus's) against the tokenizer's
limit and a MaxText-style Grain pipeline, through the benchmark package's one entry point."""

from __future__ import annotations

import argparse
import tempfile

from input_client.spec import PipelineSpec
from input_server.cli.arguments import positive
from input_server.data.builtin_corpora import BUILTIN_CORPORA, build_builtin


def _kinds(text: str) -> tuple[str, ...]:
    from input_server.benchmark.kinds import parse_kinds

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
    what = bench.add_mutually_exclusive_group(required=True)
    what.add_argument("spec", nargs="?", help="pipeline spec TOML")
    what.add_argument(
        "--builtin",
        choices=sorted(BUILTIN_CORPORA),
        help="instead of a spec: a corpus that ships with Python (stdlib-docstrings: many "
        "short documents; pydoc-topics: few long ones) and a 1000-piece sentencepiece model "
        "trained on it here, offline, in batches of 32 x 2048",
    )
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
        help="a row per tokenizer kind (sentencepiece, huggingface, tiktoken, tekken) on the "
        "spec's corpus: the spec's model for its kind, the others trained on the corpus with "
        "its vocabulary size; the server over a Unix socket only",
    )
    bench.add_argument(
        "--reference-processes",
        type=_counts,
        metavar="N,...",
        help="worker process counts to run the MaxText-style reference at, the best one "
        "compared (default 0,1,CORES)",
    )


def _builtin_spec(name: str, folder: str) -> PipelineSpec:
    """`--builtin`'s spec: the corpus and its model written in `folder`."""
    jsonl, model = build_builtin(name, folder)
    # MaxText's default max_target_length, and rows for a small TPU host's share of a global
    # batch: 65,536 tokens a batch. gRPC's cost per message is mostly fixed, so smaller
    # batches pay more per token through the server (docs/benchmarks.md, "What `bench`
    # measures").
    return PipelineSpec(
        source={"paths": [jsonl]},
        tokenizer={"model": model},
        batch={"seq_len": 2048, "size": 32},
        workers={"count": 0},
    )


def run(args: argparse.Namespace) -> int:
    from input_server.benchmark import bench

    options = dict(
        kinds=args.kinds,
        min_tokens=args.min_tokens,
        rounds=args.rounds,
        reference_processes=args.reference_processes,
        json_path=args.json,
    )
    if args.spec:
        return bench(PipelineSpec.from_toml(args.spec), **options)
    with tempfile.TemporaryDirectory(prefix="bench-") as folder:
        return bench(_builtin_spec(args.builtin, folder), **options)
