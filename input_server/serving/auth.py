"""Who may connect: Unix socket files the kernel guards (a private folder, mode 0600 or 0660),
and a shared token for abstract sockets and loopback TCP, which have no permissions.

gRPC Python cannot read a Unix peer's uid (SO_PEERCRED), so the socket files rely on file
permissions alone. What a servicer's `context.peer()` reports (grpcio 1.85, checked by hand
and by tests/integration/test_auth.py): `ipv4:127.0.0.1:PORT` / `ipv6:%5B::1%5D:PORT` for TCP,
and a bare `unix:` for BOTH socket files and abstract sockets (the client's end has no name).
So a token needed on an abstract socket is needed on the server's socket files too.

Wrong tokens slow their sender (`backoff.py`): a peer's token is checked again only after a
delay that doubles with each wrong one; meanwhile its calls are refused at once, unchecked. A
peer is what can be told apart: a TCP host (IPv6 by its /64; on loopback, the user owning the
client's socket), all Unix sockets as one (gRPC gives no uid).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import grp
import hmac
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import grpc

from input_client.addresses import (  # noqa: F401 - the server's default is the client's
    SOCKET_NAME,
    check_private_dir,
    default_socket,
    default_socket_dir,
)
from input_client.auth import MAX_TOKEN_FILE_BYTES, token_from_bytes
from input_server.quoting import quote
from input_server.serving.backoff import Backoff, LoopbackOwners, peer_key

log = logging.getLogger(__name__)

# Probes (kubelet, load balancers) carry no token; health tells them only SERVING or not.
OPEN_METHODS = "/grpc.health.v1.Health/"
UNAUTHENTICATED = "missing or wrong token; pass token= or token_file= to the client"
# A token shorter than 16 bytes can be guessed (`openssl rand -hex 16` gives 32 characters).
MIN_TOKEN_BYTES = 16
# The client sends `authorization: Bearer TOKEN` among the call's headers, which gRPC caps at
# 8 KiB in all (`grpc.max_metadata_size`): a longer token would start a server that no client
# can reach, 4 KiB leaves room for the rest.
MAX_TOKEN_BYTES = 4096
# Refused calls are logged once per peer host per this many seconds, with their count: a
# guesser (1,300 calls a second on one channel) must not fill the log, nor go unseen.
REFUSAL_LOG_S = 60.0
# Peers remembered for that, at most: past it the oldest are forgotten (a line sooner).
REFUSAL_PEERS = 1024
TOO_MANY = (
    "too many wrong tokens from this peer ({peer}); its token is not checked for another "
    "{wait:.1f} s (right or wrong), retry then"
)


# --- The default socket's folder -----------------------------------------------------------------


def ensure_private_dir(path: str, *, create: bool = True) -> None:
    """Makes `path` with mode 0700, or checks that the one there is ours and 0700: in a
    world-writable /tmp another user could have made it first, to reach or replace the socket
    (or, for a client, to pose as our server). Without `create`, a missing folder passes.

    Raises:
      PermissionError: one line naming the folder and what is wrong with it.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    check_private_dir(path)


# --- Socket files --------------------------------------------------------------------------------


def socket_gid(group: str | None) -> int | None:
    """The gid of `--socket-group` (a name or a number), None without one.

    Raises:
      ValueError: no such group.
    """
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        if group.isascii() and group.isdigit():
            return int(group)
        raise ValueError(f"--socket-group {group!r}: no such group.") from None


@contextlib.contextmanager
def owner_only_umask() -> Iterator[None]:
    """Socket files bound inside are born 0600: a chmod after the bind would leave a moment in
    which anyone could connect. The umask is the process's: files other threads create in
    this moment get no group or other bits either, which errs on the safe side."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)


def share_socket(path: str, gid: int | None, group: str | None) -> None:
    """Sets the socket file's final mode: 0600, or 0660 with group `gid` (chown first, so the
    group bits open only to that group).

    Raises:
      PermissionError: the group cannot be given (a user may chown only to its own groups).
    """
    if gid is None:
        os.chmod(path, 0o600)
        return
    try:
        os.chown(path, -1, gid)
    except PermissionError as e:
        raise PermissionError(
            f"--socket-group {group}: cannot give {path} to that group "
            f"({e.strerror}); you must be a member of it."
        ) from None
    os.chmod(path, 0o660)


# --- The token -----------------------------------------------------------------------------------


def read_token(path: str) -> bytes:
    """The token in `path`, a regular file only its owner may read or write.

    Raises:
      PermissionError: the file is open to its group or others.
      OSError: it cannot be read.
      ValueError: it holds no usable token.
    """
    try:  # non-blocking: a FIFO at the path must fail the start, not hang it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise OSError(f"--token-file {path}: cannot read it ({e.strerror}).") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())  # the file read, not whatever the path names later
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"--token-file {path}: not a regular file.")
        if st.st_mode & 0o077:
            raise PermissionError(
                f"--token-file {path}: has mode "
                f"{stat.S_IMODE(st.st_mode):04o}; only its owner may read "
                f"it (chmod 600 {path})."
            )
        token = token_from_bytes(f.read(MAX_TOKEN_FILE_BYTES), f"--token-file {path}")
    if not MIN_TOKEN_BYTES <= len(token) <= MAX_TOKEN_BYTES:
        raise ValueError(
            f"--token-file {path}: the token is {len(token)} bytes; it must be "
            f"{MIN_TOKEN_BYTES} to {MAX_TOKEN_BYTES} (gRPC carries at most 8 KiB of a call's "
            f"headers), e.g. `openssl rand -hex 32 > {path}`."
        )
    return token.encode()


@dataclasses.dataclass(frozen=True)
class TokenPolicy:
    """Which peers must send the token.

    Attributes:
      token: the shared token; None when no listener needs one.
      tcp: TCP peers (`ipv4:`/`ipv6:`) must send it.
      unix: Unix-socket peers (`unix:`, socket files and abstract sockets alike) must; a
        server with abstract sockets beside other listeners serves them apart (`split`).
    """

    token: bytes | None = dataclasses.field(default=None, repr=False)  # never in a log line
    tcp: bool = False
    unix: bool = False

    def split(self) -> tuple[TokenPolicy, TokenPolicy]:
        """This policy for two servers, one for the abstract sockets and one for the other
        listeners (socket files, TCP): (the others', the abstract sockets'). gRPC reports a
        socket file's peer as it does an abstract socket's ("unix:"); apart, a server's Unix
        peers are its own listeners' alone, so a socket file's clients need no token and a
        guesser on an abstract socket puts none of them in backoff (`Backoff` is per server)."""
        others = TokenPolicy(self.token if self.tcp else None, tcp=self.tcp, unix=False)
        return others, TokenPolicy(self.token if self.unix else None, tcp=False, unix=self.unix)

    def needs_token(self, peer: str) -> bool:
        if peer.startswith(("ipv4:", "ipv6:")):
            return self.tcp
        if peer.startswith("unix"):
            return self.unix
        return self.token is not None  # a peer kind not seen before: closed while a token is set


def token_policy(
    kinds: Mapping[str, str], *, token_file: str | None, insecure_tcp: bool, insecure_abstract: bool
) -> TokenPolicy:
    """Decides from the listeners (kind: "file", "abstract" or "tcp" -> one such address) and
    the operator's flags.

    Raises:
      ValueError: a TCP or abstract listener with neither a token nor its insecure flag.
      PermissionError, OSError: see `read_token`.
    """
    token = read_token(token_file) if token_file else None
    for kind, insecure, flag, what in (
        ("tcp", insecure_tcp, "--insecure-tcp", "loopback TCP"),
        ("abstract", insecure_abstract, "--insecure-abstract", "an abstract socket"),
    ):
        if kind in kinds and token is None and not insecure:
            raise ValueError(
                f"--listen {kinds[kind]}: every local user can connect to "
                f"{what}; pass --token-file FILE (clients then send its token) "
                f"or {flag} to serve it without one."
            )
    tcp = "tcp" in kinds and not insecure_tcp
    unix = "abstract" in kinds and not insecure_abstract
    return TokenPolicy(token if tcp or unix else None, tcp=tcp, unix=unix)


class TokenCheck(grpc.ServerInterceptor):
    """Answers UNAUTHENTICATED to a call without the right `authorization: Bearer TOKEN` from a
    peer that `policy` says must send it, and RESOURCE_EXHAUSTED to any call of a peer whose
    wrong tokens put it in backoff (`Backoff`); health stays open.

    gRPC runs `intercept_service` on its one thread that takes new calls, where the peer is
    not known yet: the token is compared there, and the rest is decided in the call, on its
    pool thread, which answers at once.
    """

    def __init__(self, policy: TokenPolicy):
        assert policy.token is not None
        self._policy = policy
        self._expected = b"Bearer " + policy.token
        self._refusals = Refusals()
        self._backoff = Backoff()
        self._owners = LoopbackOwners()

    def _token(self, metadata) -> bool | None:
        """Whether the call's token is right; None when it sent none (which guesses nothing)."""
        sent = next((v for k, v in metadata or () if k == "authorization"), None)
        if sent is None:
            return None
        sent = sent.encode("utf-8", "replace") if isinstance(sent, str) else sent
        return hmac.compare_digest(sent, self._expected)  # in constant time: no guessing by timing

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHODS):
            return handler
        right = self._token(handler_call_details.invocation_metadata)
        # Every call is decided in the call, a right token too: one that skipped the backoff
        # would tell a guesser which of the guesses it sent side by side was right.
        return _guarded(handler, functools.partial(self._admit, right))

    def _admit(self, right: bool | None, peer: str) -> tuple[grpc.StatusCode, str] | None:
        """None to serve the call, or the status that refuses it."""
        if not self._policy.needs_token(peer):
            return None
        if right and self._backoff.quiet():  # no peer waits: no need to know which this is
            return None
        key = peer_key(peer, self._owners)
        # A call without a token (a client not told of it) is no guess: it neither counts nor
        # waits, so it cannot put its honest neighbours on the same host in backoff.
        wait = None if right is None else self._backoff.admit(key, right)
        if wait is None and right:
            return None
        self._refusals.add(peer)
        if wait is None:
            return grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED
        return grpc.StatusCode.RESOURCE_EXHAUSTED, TOO_MANY.format(peer=quote(key), wait=wait)


class Refusals:
    """Calls refused for their token, logged once per peer host per `every_s` seconds with
    how many there were: what a guesser tries is seen, and costs one log line a minute."""

    def __init__(self, every_s: float = REFUSAL_LOG_S, peers: int = REFUSAL_PEERS):
        self._every_s, self._peers = every_s, peers
        self._lock = threading.Lock()
        # host: (last line's time, refusals since then)
        self._seen: dict[str, tuple[float | None, int]] = {}

    def add(self, peer: str) -> None:
        host = peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer
        now = time.monotonic()
        with self._lock:
            # A new host's first refusal is logged at once (`now - (now - every_s)` can round
            # below `every_s`: the first line went missing).
            logged, count = self._seen.pop(host, (None, 0))
            count += 1
            due = logged is None or now - logged >= self._every_s
            if len(self._seen) >= self._peers:  # forget the oldest (dicts keep their order)
                self._seen.pop(next(iter(self._seen)))
            self._seen[host] = (now, 0) if due else (logged, count)
        if due:
            log.warning(
                "refused %d call%s from %s for a missing or wrong token, or in its backoff "
                "after wrong ones (logged at most once every %g s per peer)",
                count,
                "" if count == 1 else "s",
                host,
                self._every_s,
            )


def _guarded(
    handler: grpc.RpcMethodHandler,
    admit: Callable[[str], tuple[grpc.StatusCode, str] | None],
):
    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        behavior = getattr(handler, kind)
        if behavior is not None:
            break

    def guarded(request, context):
        refused = admit(context.peer())
        if refused is not None:
            context.abort(*refused)
        return behavior(request, context)

    make = getattr(grpc, f"{kind}_rpc_method_handler")
    return make(
        guarded,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def interceptors(policy: TokenPolicy) -> list[grpc.ServerInterceptor]:
    """The server's interceptors: none when no listener needs a token."""
    return [TokenCheck(policy)] if policy.token is not None else []
