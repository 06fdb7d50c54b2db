"""The `input-server` command: serve, demo, info, stats, tune, bench, tokenizer train,
plot-steps."""

from __future__ import annotations

import argparse
import logging
import os
import sys

# Before grpc's import: its core logs (INFO) every failed TLS handshake, an unbounded log.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from input_client.spec import SpecError  # noqa: E402
from input_server.cli import (  # noqa: E402
    bench,
    demo,
    info,
    plot_steps,
    serve,
    stats,
    tokenizer,
    tune,
)
from input_server.errors import InputServerError  # noqa: E402
from input_server.serving.logs import TEXT_FORMAT  # noqa: E402

# One module per command, named for it (`_` in a module's name is `-` in the command's):
# `register(subparsers)` adds the command's parser, `run(args)` runs it and returns the exit
# status.
COMMANDS = {
    m.__name__.rpartition(".")[2].replace("_", "-"): m
    for m in (serve, demo, bench, info, stats, tune, tokenizer, plot_steps)
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    parser = argparse.ArgumentParser(prog="input-server", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs `input-server ARGV`; a mistake the user can fix is one line on stderr, exit 2."""
    # Grain reads absl flags; this entry point does not use absl's parser.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format=TEXT_FORMAT,
    )
    try:
        return COMMANDS[args.command].run(args)
    except (SpecError, ConnectionError, OSError, InputServerError) as e:
        print(f"input-server: {e}", file=sys.stderr)
        return 2
