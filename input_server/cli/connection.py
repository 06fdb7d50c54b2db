"""How `info` and `stats` reach a running server (or, for `stats`, a pool's): the addresses and
credentials as flags, a ready client, and one line to print when it cannot be reached."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from input_client.tls_flags import add_tls_arguments, tls_options

# A one-shot question (`info`, `stats`) asks a server that runs: one that has not answered a
# local or in-cluster connect in this long is not going to, and a user at a prompt should
# hear so before wondering whether the command hangs. `--timeout-s` waits longer.
CONNECT_TIMEOUT_S = 2.0


def add_connection_arguments(
    parser: argparse.ArgumentParser, *, positive, several: bool = False
) -> None:
    """The server to ask and how (`info`, `stats`); `positive` parses `--timeout-s`. With
    `several`, any number of addresses (`addresses`, a list) and `--addresses-file`
    (`addresses_of` reads both)."""
    if several:
        parser.add_argument(
            "addresses",
            nargs="*",
            metavar="ADDRESS",
            help="a server's gRPC target (default the address a plain `serve` listens on); "
            "several (or a fan-in's comma-separated list, as the MaxText adapter's --server) "
            "are asked at once, with every other option applying to each",
        )
        parser.add_argument(
            "--addresses-file",
            metavar="FILE",
            help="more addresses, one a line ('#' starts a comment)",
        )
    else:
        parser.add_argument(
            "address",
            nargs="?",
            help="the server's gRPC target (default the address a plain `serve` listens on)",
        )
    parser.add_argument(
        "--timeout-s",
        type=positive,
        default=CONNECT_TIMEOUT_S,
        help="seconds to wait for the server to answer (default %(default)g); a refused "
        "connection or a socket file nobody answers on is said at once",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file holding the server's token (its abstract sockets and TCP need it)",
    )
    add_tls_arguments(parser)


def addresses_of(args: argparse.Namespace) -> list[str]:
    """The addresses a `several` parser's arguments name, in order: each argument split as a
    fan-in's list (`input_client.maxtext.split_servers`: commas, gRPC's own `ipv4:` lists kept
    whole), then the file's lines, blank ones and `#` comments left out. Empty: the default.

    Raises:
      BadAddresses: the file cannot be read, names nothing, or a server is named twice.
    """
    from input_client.maxtext import split_servers

    named = [a for text in args.addresses for a in split_servers(text)]
    if args.addresses_file is not None:
        path = args.addresses_file
        try:
            with open(path, encoding="utf-8") as f:
                lines = [line.split("#", 1)[0].strip() for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise BadAddresses(f"cannot read the addresses file {path!r}: {e}") from None
        from_file = [a for line in lines if line for a in split_servers(line)]
        if not from_file:
            raise BadAddresses(f"the addresses file {path!r} names no server: one address a line")
        named.extend(from_file)
    if not all(named):
        raise BadAddresses(f"an empty address in {','.join(named)!r}")
    twice = sorted({a for a in named if named.count(a) > 1})
    if twice:
        raise BadAddresses(f"{', '.join(twice)} named twice: ask each server once")
    return named


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[tuple[Any, str]]:
    """(a ready client of the server `args.address` names, its address); a server that cannot
    be reached raises `Unreachable` with the line to print."""
    with connected_to(args, args.address) as ready:
        yield ready


@contextlib.contextmanager
def connected_to(args: argparse.Namespace, named: str | None) -> Iterator[tuple[Any, str]]:
    """(a ready client of the server at `named` (None: the default address) with `args`'s
    credentials and timeout, its address); one that cannot be reached raises `Unreachable`."""
    from input_client import InputClient, StreamError
    from input_client.addresses import check_private_dir, default_socket, default_socket_dir

    address = named or default_socket()
    try:
        if not named:  # a folder another user made could hold an impostor's socket
            check_private_dir(default_socket_dir())
        refused = refused_now(address)
        if refused:  # unlike a trainer's client, a question does not wait for a server to come
            raise ConnectionError(refused)
        with InputClient(
            address,
            connect_timeout_s=args.timeout_s,
            token_file=args.token_file,
            **tls_options(args),
        ) as client:
            client.wait_ready()
            yield client, address
    except (ConnectionError, StreamError, OSError, ValueError) as e:  # ValueError: the token
        said = "" if named or address in str(e) else f" (the default address {address})"
        raise Unreachable(f"input-server: {e}{said}") from None


def refused_now(address: str) -> str | None:
    """Why `address` refuses a connection now (a socket file nobody answers on, left by a
    killed server; a TCP port nobody listens on), else None: anything else (no answer yet, a
    name that does not resolve, TLS) is the client's wait to tell."""
    import socket

    from input_client import addresses
    from input_client.tls import host_port

    path = addresses.socket_path(address)
    if path is not None:
        if addresses.is_socket(path) and addresses.nobody_answers(path, timeout_s=0.5):
            return (
                f"no input server reachable at {address!r}: nobody answers on the socket "
                f"file {path} (left by a server that was killed?); is `input-server serve` "
                f"running?"
            )
        return None
    target = host_port(address)
    # Several targets: one refusing says nothing of the others. A path without its scheme
    # is the client's to name.
    if target is None or "," in address or addresses.looks_like_a_path(address):
        return None
    try:
        socket.create_connection(target, timeout=CONNECT_TIMEOUT_S).close()
    except ConnectionRefusedError:
        host, port = target
        at = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return (
            f"no input server reachable at {address!r}: nothing listens at {at} (connection "
            f"refused); is `input-server serve --listen {at}` running?"
        )
    except (OSError, UnicodeError):  # no answer, no such name: the client's wait says which
        return None
    return None


class Unreachable(Exception):
    """The server named cannot be asked; the message is the line to print."""


class BadAddresses(ValueError):
    """The addresses given cannot be asked as they are; the message says why."""
