"""`input-server info`: print a running server's info."""

from __future__ import annotations

import argparse

from input_server.cli.arguments import positive
from input_server.tools import show_info


def register(subparsers) -> None:
    show_info.add_parser(subparsers, positive=positive(float))


def run(args: argparse.Namespace) -> int:
    return show_info.run(args)
