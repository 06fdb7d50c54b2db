"""`input-server demo`: train a tiny JAX model through the server, offline."""

from __future__ import annotations

import argparse

from input_server.tools import demo


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="train a tiny JAX model through the server, offline"
    )
    demo.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return demo.run_from_args(args)
