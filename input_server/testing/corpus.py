"""The benchmark scripts' corpus options: a jsonl file and model, or a builtin corpus.

The builtin corpora and the sentencepiece trainer are the product's (`input-server demo`,
`tokenizer train` and `bench` use them): import them from `input_server.data.builtin_corpora`
and `input_server.data.tokenizers.trainers`.
"""

from __future__ import annotations

import argparse
import tempfile

from input_server.data.builtin_corpora import BUILTIN_CORPORA, build_builtin

__all__ = ["add_corpus_arguments", "corpus_from_arguments"]


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark scripts' corpus options: a jsonl file and model, or a builtin corpus."""
    parser.add_argument("--corpus", help="jsonl file with a 'text' field")
    parser.add_argument("--model", help="sentencepiece model")
    parser.add_argument(
        "--builtin",
        choices=sorted(BUILTIN_CORPORA),
        help="a corpus that ships with Python; its tokenizer is trained here",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=1000,
        help="vocabulary of the tokenizer trained for --builtin",
    )


def corpus_from_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[str, str]:
    """(jsonl, model) from `add_corpus_arguments`' options; a builtin is built in a fresh
    temporary folder. Exits through `parser.error` when neither is given."""
    if args.builtin:
        return build_builtin(
            args.builtin, tempfile.mkdtemp(prefix="bench-"), vocab_size=args.vocab_size
        )
    if not (args.corpus and args.model):
        parser.error("give --corpus and --model, or --builtin")
    return args.corpus, args.model
