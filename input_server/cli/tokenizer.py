"""`input-server tokenizer train`: make a sentencepiece model for your own corpus."""

from __future__ import annotations

import argparse

from input_server.tools import tokenizer_train


def register(subparsers) -> None:
    tokenizer_train.add_parser(subparsers)  # `tokenizer` and its one verb, `train`


def run(args: argparse.Namespace) -> int:
    return tokenizer_train.run_from_args(args)
