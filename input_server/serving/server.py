"""Server lifecycle: listen addresses, the gRPC server with health checking, draining stop."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from input_client.proto import pb, pb_grpc
from input_client.spec import PipelineSpec
from input_client.wire import MESSAGE_OPTIONS
from input_server.autotune.tuner import Tuner
from input_server.batching.pipeline import Pipeline
from input_server.serving.coalesce import MESSAGE_TOKENS
from input_server.serving.service import InputServicer

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InputService"].full_name


def default_socket() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return f"unix://{os.path.join(base, f'input-server-{os.getuid()}.sock')}"


@dataclasses.dataclass(frozen=True)
class Address:
    """A listen address: what gRPC binds and how clients reach it."""

    bind: str
    is_unix: bool
    host: str = ""
    port: int = 0


def parse_address(address: str) -> Address:
    """Accepts `unix:PATH`, `unix:///ABS/PATH`, `unix-abstract:NAME` or a loopback `HOST:PORT`.

    Raises:
      ValueError: the address is malformed, or not loopback (TLS, needed for that, comes later).
    """
    if address.startswith(("unix:", "unix-abstract:")):
        if address.rstrip("/") in ("unix:", "unix-abstract:"):
            raise ValueError(f"--listen {address!r}: the Unix socket needs a path.")
        if address.startswith("unix://") and not address.startswith("unix:///"):
            raise ValueError(f"--listen {address!r}: unix:// takes an absolute path "
                             f"(unix:///abs/path.sock); a relative one is unix:path.sock.")
        return Address(bind=address, is_unix=True)
    host, sep, port = address.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not host:
        raise ValueError(f"--listen {address!r}: expected unix:PATH or HOST:PORT "
                         f"(e.g. 127.0.0.1:50051; port 0 picks a free port).")
    if len(port) > 5 or int(port) > 65535:
        raise ValueError(f"--listen {address!r}: port {port} is out of range (0 to 65535; "
                         f"0 picks a free port).")
    bare = host.strip("[]")
    loopback = bare == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(bare).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise ValueError(f"--listen {address!r}: only loopback addresses (127.0.0.1, [::1], "
                         f"localhost) or Unix sockets are allowed until TLS is supported; "
                         f"a non-loopback listener would serve data to anyone on the network.")
    return Address(bind=address, is_unix=False, host=host, port=int(port))


def _claim_socket_path(path: str, address: str) -> None:
    """Makes way for a new Unix socket at `path`: a stale socket file (nobody answers) is
    removed; a live server's socket, or a file that is not a socket, is refused.

    Raises:
      OSError: the path is in use by a running server, or is not a socket.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"--listen {address}: the path exists and is not a socket; "
                      f"choose another path or remove the file.")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # stale: left by a server that died
        return
    except OSError as e:
        raise OSError(f"--listen {address}: cannot check the existing socket ({e}).") from e
    finally:
        probe.close()
    raise OSError(f"--listen {address}: in use by a running server; stop it first or "
                  f"listen on another path.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How to run the server.

    Attributes:
      listen: addresses to listen on (repeatable); default a Unix socket for a sidecar.
      pipelines: pipelines clients may ask for by name, built and checked at start-up.
      max_streams: concurrent streams (each may run worker processes); more get
        RESOURCE_EXHAUSTED at once instead of starving health checks.
      queue_depth: batches each stream prepares ahead of the network (bounded memory).
      grace_s: how long `stop()` lets streams end after telling them to.
      message_tokens: batches smaller than this (rows x seq_len) share gRPC messages of up to
        this many tokens (`coalesce.MESSAGE_TOKENS`); a batch this big or bigger goes alone.
    """

    listen: Sequence[str] = ()
    pipelines: Mapping[str, PipelineSpec] = dataclasses.field(default_factory=dict)
    max_streams: int = 8
    queue_depth: int = 4
    grace_s: float = 5.0
    message_tokens: int = MESSAGE_TOKENS

    def __post_init__(self):
        if self.max_streams < 1:
            raise ValueError(f"`max_streams` must be positive, got {self.max_streams}.")
        if self.queue_depth < 1:
            raise ValueError(f"`queue_depth` must be positive, got {self.queue_depth}.")
        if self.message_tokens < 1:
            raise ValueError(f"`message_tokens` must be positive, got {self.message_tokens}.")


class Server:
    """The input server: `Server(config)` starts it; `.targets` are what clients dial.

    Usable as a context manager; `stop()` drains (health NOT_SERVING, streams told to end
    with UNAVAILABLE so clients can resume elsewhere) and then stops.
    """

    def __init__(self, config: ServerConfig | None = None, *, start: bool = True):
        self.config = config or ServerConfig()
        addresses = [parse_address(a) for a in (self.config.listen or [default_socket()])]
        # Build named pipelines now: a bad spec file fails the start, not a client's stream.
        pipelines = {name: Pipeline(spec) for name, spec in self.config.pipelines.items()}
        self._draining = threading.Event()
        self._stopped = threading.Event()
        self._servicer = InputServicer(pipelines, max_streams=self.config.max_streams,
                                       queue_depth=self.config.queue_depth,
                                       message_tokens=self.config.message_tokens,
                                       draining=self._draining, tuner=Tuner())
        # Streams hold a thread each; the spare threads keep health and info answering when
        # every stream slot is busy.
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.config.max_streams + 4,
                                       thread_name_prefix="rpc"),
            options=[("grpc.so_reuseport", 0), *MESSAGE_OPTIONS])
        pb_grpc.add_InputServiceServicer_to_server(self._servicer, self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self.targets: list[str] = []
        self._unix_sockets: list[tuple[str, tuple[int, int]]] = []  # path, (device, inode)
        for a in addresses:
            path = a.bind.removeprefix("unix://").removeprefix("unix:") \
                if a.bind.startswith("unix:") else None
            try:
                if path is not None:
                    _claim_socket_path(path, a.bind)
                port = self._server.add_insecure_port(a.bind)
            except (RuntimeError, OSError) as e:
                self._server.stop(None)  # release the addresses already bound
                self._remove_own_sockets()
                if isinstance(e, OSError):
                    raise
                raise OSError(f"--listen {a.bind!r}: cannot bind ({e}).") from e
            if a.is_unix:
                self.targets.append(a.bind)
                if path is not None:
                    st = os.stat(path)
                    self._unix_sockets.append((path, (st.st_dev, st.st_ino)))
            else:
                if port == 0:
                    self._server.stop(None)
                    self._remove_own_sockets()
                    raise OSError(f"--listen {a.bind!r}: cannot bind (address in use?).")
                self.targets.append(f"{a.host}:{port}")
        if start:
            self.start()

    def start(self) -> None:
        self._server.start()
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving on %s", ", ".join(self.targets))

    def stop(self, grace: float | None = None) -> None:
        """Drains and stops; safe to call twice."""
        if self._stopped.is_set():
            return
        self._health.enter_graceful_shutdown()
        self._draining.set()
        self._server.stop(self.config.grace_s if grace is None else grace).wait()
        self._remove_own_sockets()
        self._stopped.set()

    def _remove_own_sockets(self) -> None:
        """Removes the socket files this server created, and no other: a file another server
        put at the same path since is left alone."""
        for path, identity in self._unix_sockets:
            try:
                st = os.stat(path)
                if (st.st_dev, st.st_ino) == identity:
                    os.unlink(path)
            except FileNotFoundError:
                pass
        self._unix_sockets = []

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until `stop()` has finished; returns whether it has."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
