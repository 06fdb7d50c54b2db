"""`input-server stats`: where a running server's streams spend their time, and the verdict."""

from __future__ import annotations

import argparse

from input_server.cli.arguments import positive
from input_server.tools import show_stats


def register(subparsers) -> None:
    show_stats.add_parser(subparsers, positive=positive(float))


def run(args: argparse.Namespace) -> int:
    return show_stats.run(args)
