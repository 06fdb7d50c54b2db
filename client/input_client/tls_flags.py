"""The client's TLS options as command-line flags, for `input-server info` and the MaxText
launcher alike."""

from __future__ import annotations

from typing import Any


def add_tls_arguments(parser: Any) -> None:
    """The client's TLS flags on an argparse parser (`input-server info`, the MaxText
    launcher): --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name; `tls_options(args)`
    turns them into `InputClient`'s keywords."""
    parser.add_argument(
        "--tls",
        action="store_true",
        help="connect with TLS, the server verified by the default roots (a public CA)",
    )
    parser.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="PEM CA certificates that verify the server (implies --tls)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="PEM client certificate, for a server with --tls-client-ca (with --tls-key)",
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the unencrypted PEM key of --tls-cert")
    parser.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="the name the server's certificate holds, when not the host dialed",
    )


def tls_options(args: Any) -> dict[str, Any]:
    """`InputClient`'s TLS keywords from the flags `add_tls_arguments` added."""
    return {
        "tls": args.tls,
        "tls_ca": args.tls_ca,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_server_name": args.tls_server_name,
    }
