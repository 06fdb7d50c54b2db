"""Listen addresses: what `--listen` accepts, making way for a Unix socket file, and binding
one with a failure said in one line."""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import os
import re
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Callable

from input_client.addresses import default_socket, socket_path

# Linux's sun_path holds 108 bytes, the last a NUL: a longer path cannot be bound.
MAX_SOCKET_PATH = 107


@dataclasses.dataclass(frozen=True)
class Address:
    """A listen address: what gRPC binds and how clients reach it.

    `kind` decides who may connect (`auth`): "file" (a socket file: its mode), "abstract" or
    "tcp" (anyone on the host: the token). A TCP address that is not `loopback` (a host IP, a
    wildcard, a name other than localhost) is reachable off the host: it needs TLS too
    (`tls.check_exposure`).
    """

    bind: str
    is_unix: bool
    host: str = ""
    port: int = 0
    kind: str = "tcp"
    loopback: bool = True


def parse_address(address: str) -> Address:
    """Accepts `unix:PATH`, `unix:///ABS/PATH`, `unix-abstract:NAME` or `HOST:PORT`; whether a
    TCP address may be served (TLS and a token off loopback) is decided with the server's
    flags, `tls.check_exposure`.

    Raises:
      ValueError: the address is malformed (a URL such as http://HOST:PORT says which form).
    """
    if address.startswith(("unix:", "unix-abstract:")):
        if address.rstrip("/") in ("unix:", "unix-abstract:"):
            raise ValueError(f"--listen {address!r}: the Unix socket needs a path.")
        if address.startswith("unix://") and not address.startswith("unix:///"):
            raise ValueError(
                f"--listen {address!r}: unix:// takes an absolute path "
                f"(unix:///abs/path.sock); a relative one is unix:path.sock."
            )
        kind = "abstract" if address.startswith("unix-abstract:") else "file"
        path = os.fsencode(socket_path(address) or "")
        if kind == "file" and len(path) > MAX_SOCKET_PATH:
            raise ValueError(
                f"--listen {address!r}: the socket path is {len(path)} bytes, more than the "
                f"{MAX_SOCKET_PATH} a Unix socket allows; choose a shorter path (the default "
                f"one lies under $XDG_RUNTIME_DIR, else $TMPDIR)."
            )
        return Address(bind=address, is_unix=True, kind=kind)
    if "://" in address:  # a URL (http://, grpc://, dns:///): its host read as a remote name
        rest = address.split("://", 1)[1].lstrip("/").split("/", 1)[0] or "localhost:50051"
        raise ValueError(
            f"--listen {address!r}: {address.split('://', 1)[0]}:// is not an address form; "
            f"give HOST:PORT ({rest}) or unix:PATH."
        )
    host, sep, port = address.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not host:
        raise ValueError(
            f"--listen {address!r}: expected unix:PATH or HOST:PORT "
            f"(e.g. 127.0.0.1:50051; port 0 picks a free port)."
        )
    if len(port) > 5 or int(port) > 65535:
        raise ValueError(
            f"--listen {address!r}: port {port} is out of range (0 to 65535; 0 picks a free port)."
        )
    return Address(
        bind=address, is_unix=False, host=host, port=int(port), loopback=is_loopback(host)
    )


def is_loopback(host: str) -> bool:
    """Whether `host` (an IP, `[IPv6]` or a name) is reachable from this host only: a
    loopback address or `localhost`; a name other than localhost counts as reachable off the
    host whatever it resolves to."""
    bare = host.strip("[]")
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


# socket()'s answers on a host that allows no sockets of a family: EAFNOSUPPORT from a kernel
# or sandbox without it (gVisor on TPU hosts: Unix sockets only), EPERM or EACCES from a
# seccomp or LSM policy. Others (out of descriptors, memory) are not the host's rule.
_REFUSALS = (errno.EAFNOSUPPORT, errno.EPERM, errno.EACCES)


def tcp_refused() -> str | None:
    """Why this host makes no TCP sockets at all, neither IPv4 nor IPv6 (e.g. "this host
    refuses TCP sockets (Address family not supported by protocol)"), or None where it makes
    one of them: what needs TCP (a TCP listener, the metrics page, the health port, loopback
    benchmarks) says so instead of failing deeper down. Creates sockets only; binds nothing."""
    reasons = []
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.socket(family, socket.SOCK_STREAM).close()
        except OSError as e:
            if e.errno not in _REFUSALS:
                return None
            reasons.append(e.strerror or str(e))
        else:
            return None
    return f"this host refuses TCP sockets ({'; '.join(dict.fromkeys(reasons))})"


def claim_socket_path(path: str, said: str) -> None:
    """Makes way for a new Unix socket at `path`: a stale socket file (nobody answers) is
    removed; a live server's socket, a file that is not a socket, or a folder that is missing
    or not ours to write in is refused. `said` names the address in the message
    ("--listen unix:///x.sock", "the default socket unix:///...").

    Raises:
      OSError: one line with the way out.
    """
    check_socket_folder(path, said)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(
            f"{said}: the path exists and is not a socket; choose another path or remove the file."
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # stale: left by a server that died
        return
    except OSError as e:
        raise OSError(f"{said}: cannot check the existing socket ({e}).") from e
    finally:
        probe.close()
    raise OSError(
        f"{said}: in use by a running server (`input-server info unix://{os.path.abspath(path)}` "
        f"asks it); stop it first or listen on another path."
    )


# One line of gRPC's C core on stderr (absl's format): "E1206 13:49:36.460897   23827
# add_port.cc:83] Failed to add port ...".
CORE_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.-]+:\d+\] ")
# What the kernel said, as gRPC's core words it: "Error in bind for address '...': REASON".
# A wildcard's two binds run together ("...: Address already in useError in bind for ...").
_BIND_REASON = re.compile(r"Error in bind for address '[^']*': (.+?)(?=Error in bind|[)\n]|$)")
# Only one thread may hold fd 2 at a time: a second would restore the first's file.
_HOLDING_STDERR = threading.Lock()


def add_port(add: Callable[[], int], said: str, a: Address) -> int:
    """`add()` (gRPC's `add_insecure_port` or `add_secure_port`), with what gRPC's core writes to
    stderr held back: a failure is one line with the way out, not the core's log line and
    "set GRPC_VERBOSITY=debug" (GRPC_VERBOSITY=ERROR still logs it). Other threads' stderr in
    that moment is written out after.

    Returns:
      the port bound (a Unix socket: 1).

    Raises:
      OSError: `add` failed; `said` names the address ("--listen 127.0.0.1:50051").
    """
    with _HOLDING_STDERR:
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all: nothing to hold back
            saved = None
        with tempfile.TemporaryFile() as held:
            if saved is not None:
                _flush_stderr()
                os.dup2(held.fileno(), 2)
            try:
                port, error = add(), ""
            except RuntimeError as e:
                port, error = 0, str(e)
            finally:
                if saved is not None:
                    _flush_stderr()
                    os.dup2(saved, 2)
                    os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
    core = [line for line in lines if CORE_LINE.match(line)]
    if port:
        core = []  # a bound port's notes (localhost's ::1 alone) stay the operator's to read
    others = "".join(line for line in lines if line not in core)
    if others:
        os.write(2, others.encode())
    if port:
        return port
    raise OSError(bind_failure(said, a, " ".join(core) or error))


def _flush_stderr() -> None:
    """What Python buffered for stderr, written to the fd 2 of its time (none: no stderr)."""
    if sys.stderr is not None:
        sys.stderr.flush()


def bind_failure(said: str, a: Address, core: str) -> str:
    """The one line for a bind gRPC refused, from the reason its core gave (`core`: its log
    line, or its exception's words)."""
    reasons = _BIND_REASON.findall(core)
    reason = reasons[-1].strip() if reasons else ""
    if reason == "Address already in use":
        if a.is_unix:
            return f"{said}: cannot bind, in use; choose another name or stop what holds it."
        return (
            f"{said}: cannot bind, port {a.port} is in use; choose another port (0 picks a "
            f"free one) or stop what holds it."
        )
    if reason == "Permission denied" and not a.is_unix and 0 < a.port < 1024:
        return (
            f"{said}: ports below 1024 need root (or CAP_NET_BIND_SERVICE); choose a port "
            f"from 1024 up."
        )
    if reason == "Cannot assign requested address":
        return (
            f"{said}: {a.host} is not an address of this host; listen on one of its "
            f"addresses (127.0.0.1: this host only)."
        )
    tail = core.split("] ", 1)[-1].strip() if core else "no reason given"
    return f"{said}: cannot bind ({reason or tail})."


def connection_options(
    *,
    max_connections: int,
    streams_per_connection: int,
    handshake_s: float,
    idle_s: float,
    age_s: float | None = None,
    age_grace_s: float = 10.0,
) -> list[tuple[str, int]]:
    """gRPC core's bounds on what peers may hold before any credential is checked (gRPC's
    defaults hold none: any number of connections, unhandshaked ones for 120 s, idle ones
    forever, and as many streams on each as a peer opens).

    Args:
      max_connections: connections at once; past it gRPC closes new ones at once. Below
        the descriptor limit, so that held connections cannot deny the server its files.
      streams_per_connection: calls at once on one connection (HTTP/2
        SETTINGS_MAX_CONCURRENT_STREAMS); more are refused by gRPC's core with RST_STREAM,
        before they cost a thread.
      handshake_s: how long a new connection has for its TLS handshake (plaintext: at once).
      idle_s: a connection with no call for this long is closed (GOAWAY; a client's channel
        reconnects at its next call).
      age_s, age_grace_s: a connection is told to go after `age_s` and closed `age_grace_s`
        later; None: never (a long stream must not be cut).
    """
    options = [
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.max_concurrent_streams", streams_per_connection),
        ("grpc.server_handshake_timeout_ms", int(handshake_s * 1000)),
        ("grpc.max_connection_idle_ms", int(idle_s * 1000)),
    ]
    if age_s is not None:
        options += [
            ("grpc.max_connection_age_ms", int(age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(age_grace_s * 1000)),
        ]
    return options


def check_socket_folder(path: str, said: str) -> None:
    """The folder of socket file `path`: there, and ours to create files in (the socket and its
    lock, `socket_lock`); `said` names the address.

    Raises:
      OSError: one line with the way out.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # checked here: gRPC's core would log its bind failure
        if os.path.lexists(folder):
            raise OSError(f"{said}: {folder} is not a folder; choose another path.")
        raise OSError(
            f"{said}: the folder {folder} does not exist; create it (mkdir -p {folder}) or "
            f"choose another path."
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OSError(
            f"{said}: you may not create files in {folder} (permission denied); choose a "
            f"folder of yours, or leave out --listen for the default socket ({default_socket()})."
        )
