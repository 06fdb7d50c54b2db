"""The client's half of the token check: what a token file holds, and sending the token."""

from __future__ import annotations

import collections

import grpc

# gRPC metadata values are printable ASCII (RFC 7230 header values); anything else fails
# every call with an opaque "metadata was invalid" error, so refuse it where it is read.
_PRINTABLE = frozenset(range(0x21, 0x7F))
# A token is short: a bigger file is a wrong path, read no further.
MAX_TOKEN_FILE_BYTES = 64 << 10


def check_token(token: str, source: str) -> str:
    """The token without surrounding whitespace (a file ends with a newline).

    Raises:
      ValueError: the token is empty or not printable ASCII; `source` names where it came from.
    """
    token = token.strip()
    if not token:
        raise ValueError(f"{source}: the token is empty; write one, e.g. `openssl rand -hex 32`.")
    if not all(ord(c) in _PRINTABLE for c in token):
        raise ValueError(
            f"{source}: the token must be printable ASCII without spaces, e.g. "
            f"`openssl rand -hex 32`."
        )
    return token


def token_from_bytes(data: bytes, source: str) -> str:
    """The token in a file's bytes (see `check_token`)."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = "\0"  # refused as not printable ASCII
    return check_token(text, source)


def read_token_file(path: str) -> str:
    """The token in `path`, read once.

    Raises:
      OSError: the file cannot be read.
      ValueError: it holds no usable token.
    """
    with open(path, "rb") as f:
        return token_from_bytes(f.read(MAX_TOKEN_FILE_BYTES), f"token file {path}")


class _Details(
    collections.namedtuple(
        "_Details",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer TOKEN` to every call (unary `GetInfo`, bidirectional
    `StreamBatches`; server-streaming for callers that send one request)."""

    def __init__(self, token: str):
        self._metadata = (("authorization", f"Bearer {token}"),)

    def _with_token(self, d: grpc.ClientCallDetails) -> _Details:
        return _Details(
            d.method,
            d.timeout,
            (*(d.metadata or ()), *self._metadata),
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)
