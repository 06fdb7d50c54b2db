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
from input_server.serving.logs import TEXT_FORMAT, json_stderr  # noqa: E402

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
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log at INFO level (before or after the verb)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.register(subparsers)
    return parser


# `-v` is also taken after the verb (`input-server serve -v ...`): people add a flag at the end
# of the line they just ran, and argparse's "unrecognized arguments: -v" did not say it goes
# before the verb.
VERBOSE_FLAGS = ("-v", "--verbose")


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, with `-v`/`--verbose` anywhere on the line (a verb's parser
    leaves it unknown; any other unknown argument is refused as argparse refuses it)."""
    args, unknown = parser.parse_known_args(argv)
    rest = [a for a in unknown if a not in VERBOSE_FLAGS]
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.verbose = args.verbose or len(rest) < len(unknown)
    return args


def _asks_for_json(argv: list[str]) -> bool:
    """Whether `argv` holds `--log-format json` (or `--log-format=json`), seen before parsing."""
    pairs = zip(argv, argv[1:], strict=False)
    return "--log-format=json" in argv or any(a == "--log-format" and b == "json" for a, b in pairs)


def main(argv: list[str] | None = None) -> int:
    """Runs `input-server ARGV`; a mistake the user can fix is one line on stderr, exit 2."""
    # Grain reads absl flags; this entry point does not use absl's parser.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    if _asks_for_json(sys.argv[1:] if argv is None else argv):
        json_stderr()  # before argparse, whose usage errors are written as it parses
    args = parse_arguments(build_parser(), argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format=TEXT_FORMAT,
    )
    try:
        return COMMANDS[args.command].run(args)
    except (SpecError, ConnectionError, OSError, InputServerError) as e:
        if args.verbose:  # where it was raised, for a report; the line below is the user's
            import traceback

            traceback.print_exc()
        print(f"input-server: {e}", file=sys.stderr)
        return 2
