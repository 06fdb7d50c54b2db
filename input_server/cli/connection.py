"""How `info` and `stats` reach a running server: its address and credentials as flags, a ready
client, and one line to print when it cannot be reached."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from input_client.tls_flags import add_tls_arguments, tls_options


def add_connection_arguments(parser: argparse.ArgumentParser, *, positive) -> None:
    """The server to ask and how (`info`, `stats`); `positive` parses `--timeout-s`."""
    parser.add_argument(
        "address",
        nargs="?",
        help="the server's gRPC target (default the address a plain `serve` listens on)",
    )
    parser.add_argument("--timeout-s", type=positive, default=10.0)
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file holding the server's token (its abstract sockets and TCP need it)",
    )
    add_tls_arguments(parser)


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[tuple[Any, str]]:
    """(a ready client of the server `args` name, its address); a server that cannot be
    reached raises `Unreachable` with the line to print."""
    from input_client import InputClient, StreamError
    from input_client.addresses import check_private_dir, default_socket, default_socket_dir

    address = args.address or default_socket()
    try:
        if not args.address:  # a folder another user made could hold an impostor's socket
            check_private_dir(default_socket_dir())
        with InputClient(
            address,
            connect_timeout_s=args.timeout_s,
            token_file=args.token_file,
            **tls_options(args),
        ) as client:
            client.wait_ready()
            yield client, address
    except (ConnectionError, StreamError, OSError, ValueError) as e:  # ValueError: the token
        said = "" if args.address or address in str(e) else f" (the default address {address})"
        raise Unreachable(f"input-server: {e}{said}") from None


class Unreachable(Exception):
    """The server named cannot be asked; the message is the line to print."""
