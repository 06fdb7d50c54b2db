"""`input-server tune`: measure a spec's pipeline at candidate worker counts."""

from __future__ import annotations

import argparse

from input_server.tools import tune_cli


def register(subparsers) -> None:
    tune_cli.add_parser(subparsers)


def run(args: argparse.Namespace) -> int:
    return tune_cli.run(args)
