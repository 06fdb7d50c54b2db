"""Server lifecycle: the gRPC server on its listen addresses (TLS on TCP where configured),
health checking (and its plaintext probe port), draining stop."""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from input_client.proto import pb
from input_client.spec import PipelineSpec
from input_client.wire import MESSAGE_OPTIONS
from input_server.autotune.openings import Openings
from input_server.autotune.remembered import TuneCache
from input_server.batching.pipeline import Pipeline
from input_server.data.records import configure_open_files
from input_server.data.roots import DataAccess
from input_server.errors import InvalidSpecError
from input_server.serving import auth, probes, tls
from input_server.serving.auth import default_socket
from input_server.serving.call_limits import CallLimits
from input_server.serving.coalesce import MESSAGE_TOKENS
from input_server.serving.limits import Limits, check_workers
from input_server.serving.listen import (  # noqa: F401
    Address,
    claim_socket_path,
    connection_options,
    parse_address,
)
from input_server.serving.service import InputServicer, add_to_server

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4 << 20
# Threads beyond every cap: a call refused for a cap still needs one to hear why.
SPARE_THREADS = 2
# Connections at once, as a share of the descriptor limit (readers keep a quarter open, and
# workers, pipes and logs need theirs): idle sockets past it must not take every descriptor.
CONNECTION_SHARE = 4
# A TLS handshake that has not finished in this long is a peer holding a socket, not a slow
# network; a connection with no call for a minute is closed (its channel reconnects at its
# next call). No age limit: a stream may run for days on one connection.
HANDSHAKE_S = 10.0
IDLE_S = 60.0
# Calls at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; more are refused by
# gRPC's core before they cost a thread), as a share of the pool's threads. At the whole pool
# (84), 4 connections of silent calls filled the server's backlog (`maximum_concurrent_rpcs`,
# 4 x the pool): a probe was refused ("Concurrent RPC limit exceeded") or queued behind them
# for seconds. At three quarters, 4 such connections leave a pool's worth of it to others.
# Not much lower: channels of one process share a connection, and a call opened as another
# ends races the server's count of its streams (RST_STREAM REFUSED_STREAM, UNAVAILABLE to the
# client: at 16, 16 clients starting at once in one process were refused so).
CONNECTION_CALLS_PCT = 75
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InputService"].full_name


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How to run the server.

    Attributes:
      listen: addresses to listen on (repeatable); default a Unix socket for a sidecar.
      pipelines: pipelines clients may ask for by name, built and checked at start-up (or
        built already: a `testing.SlowPipeline` stands remote storage in for benchmarks).
      max_streams: concurrent streams (each may run worker processes); more get
        RESOURCE_EXHAUSTED at once instead of starving health checks.
      queue_depth: batches each stream prepares ahead of the network (bounded memory).
      grace_s: how long `stop()` lets streams end after telling them to.
      message_tokens: batches smaller than this (rows x seq_len) share gRPC messages of up to
        this many tokens (`coalesce.MESSAGE_TOKENS`); a batch this big or bigger goes alone.
      data_roots: folders a request's files and model must resolve into (real paths, links
        followed); default the working directory. `pipelines` are the operator's and exempt.
      token_file: a file (readable by its owner only) holding the token clients must send on
        abstract sockets and TCP; without it those listeners need `insecure_tcp` /
        `insecure_abstract`.
      insecure_tcp, insecure_abstract: the operator's explicit choice to serve loopback TCP or
        abstract sockets, open to every local user, without a token.
      tls_cert, tls_key: PEM certificate chain and unencrypted key; given, every TCP listener
        serves TLS (Unix sockets stay plaintext) and may be off loopback (with `token_file`).
        Re-read when they change, for new connections (`tls.CertificateFiles`).
      tls_client_ca: PEM CA certificates; given, TLS clients must present a certificate that
        chains to one of them (mutual TLS).
      health_port: a plaintext port on every interface serving only gRPC health, for probes
        that cannot use TLS or a token (`probes.py`); 0 picks a free one; None: none.
      socket_group: a group that may use the Unix socket files too (mode 0660, else 0600).
      stream_memory_mb: the most memory one stream may hold (queue, messages, groups in
        flight); a spec that cannot fit is refused with RESOURCE_EXHAUSTED.
      max_document_mb: a longer document ends its stream with INVALID_ARGUMENT.
      max_files: the most files a request's paths may name after globbing.
      max_decompressed_mb: the most the compressed (.gz, .zst) files that requests read may
        expand to in memory, all streams' together, in each process (each file is held whole,
        once per process that reads it: `records.DECOMPRESSED`); past it the stream ends with
        RESOURCE_EXHAUSTED naming the file. 1024: a C4 shard (~800 MB) fits, a 310 KB zstd
        bomb of 3.4 GiB does not, nor do several smaller ones at once.
      max_open_files: the most data files each process keeps open (least recently used closed
        first, so a source may name far more); default a quarter of the descriptor limit,
        which the server raises to its hard limit at start, at most 1024 (`records.py`).
      max_workers: worker processes across all streams of this server; default the CPU count.
      tune_cache: a folder where "auto" choices persist across restarts (the CLI's default:
        `remembered.default_folder()`); None = kept in memory only.
    """

    listen: Sequence[str] = ()
    pipelines: Mapping[str, PipelineSpec | Pipeline] = dataclasses.field(default_factory=dict)
    max_streams: int = 8
    queue_depth: int = 4
    grace_s: float = 5.0
    message_tokens: int = MESSAGE_TOKENS
    data_roots: Sequence[str] = ()
    token_file: str | None = None
    insecure_tcp: bool = False
    insecure_abstract: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    health_port: int | None = None
    socket_group: str | None = None
    stream_memory_mb: float = 2048.0
    max_document_mb: float = 64.0
    max_files: int = 100_000
    max_decompressed_mb: float = 1024.0
    max_open_files: int | None = None
    max_workers: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    tune_cache: str | None = None

    def __post_init__(self):
        if self.max_streams < 1:
            raise ValueError(f"`max_streams` must be positive, got {self.max_streams}.")
        if self.queue_depth < 1:
            raise ValueError(f"`queue_depth` must be positive, got {self.queue_depth}.")
        if self.message_tokens < 1:
            raise ValueError(f"`message_tokens` must be positive, got {self.message_tokens}.")
        for name in ("stream_memory_mb", "max_document_mb", "max_files", "max_decompressed_mb"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}.")
        if self.max_workers < 0:
            raise ValueError(f"`max_workers` must be 0 or more, got {self.max_workers}.")
        if self.max_open_files is not None and self.max_open_files < 1:
            raise ValueError(f"`max_open_files` must be positive, got {self.max_open_files}.")
        roots = tuple(os.path.realpath(r) for r in (self.data_roots or (os.getcwd(),)))
        for r in roots:
            if not os.path.isdir(r):
                raise ValueError(f"--data-root {r!r}: not a folder.")
        object.__setattr__(self, "data_roots", roots)
        for flag in ("token_file", "tls_cert", "tls_key", "tls_client_ca"):
            if getattr(self, flag) == "":
                raise ValueError(f"--{flag.replace('_', '-')}: empty path.")
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("cert", "key") if self.tls_key is None else ("key", "cert")
            raise ValueError(
                f"--tls-{given} needs --tls-{missing} FILE too (a certificate and its key)."
            )
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError(
                "--tls-client-ca: mutual TLS needs the server's own certificate too: "
                "pass --tls-cert FILE and --tls-key FILE."
            )
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(
                f"--health-port {self.health_port}: out of range (0 to 65535; 0 picks a free port)."
            )
        if self.socket_group is not None and not any(a.startswith("unix:") for a in self.listen):
            # The default socket's folder is 0700: the group could not reach the socket.
            raise ValueError(
                f"--socket-group {self.socket_group!r} applies to socket files: "
                f"add --listen unix:///PATH.sock in a folder the group can enter "
                f"(the default socket's folder is private to you)."
            )


def max_connections() -> int:
    """Connections the main listeners take at once: a share of the descriptor limit, as
    raised at start (`configure_open_files`)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 16
    return max(16, soft // CONNECTION_SHARE)


class Server:
    """The input server: `Server(config)` starts it; `.targets` are what clients dial,
    `.health_port` the plaintext health port (when configured), `.certificates` the TLS files
    served (`tls.CertificateFiles`, None without TLS).

    Usable as a context manager; `stop()` drains (health NOT_SERVING, streams told to end
    with UNAVAILABLE so clients can resume elsewhere) and then stops.
    """

    def __init__(self, config: ServerConfig | None = None, *, start: bool = True):
        self.config = config or ServerConfig()
        addresses = [parse_address(a) for a in (self.config.listen or [default_socket()])]
        c = self.config
        tls.check_exposure(
            addresses,
            tls=c.tls_cert is not None,
            token_file=c.token_file,
            insecure_tcp=c.insecure_tcp,
        )
        if c.tls_cert and all(a.is_unix for a in addresses):
            log.warning("--tls-cert: no TCP listener to use it on; Unix sockets stay plaintext")
        # Descriptors: the soft limit raised to the hard one, and the share readers keep.
        configure_open_files(self.config.max_open_files)
        if not self.config.listen:  # other users must not reach the folder of the default
            auth.ensure_private_dir(auth.default_socket_dir())
        # Who may connect, decided before anything is built or bound: a mistake is one line.
        gid = auth.socket_gid(self.config.socket_group)
        policy = auth.token_policy(
            {a.kind: a.bind for a in addresses},
            token_file=self.config.token_file,
            insecure_tcp=self.config.insecure_tcp,
            insecure_abstract=self.config.insecure_abstract,
        )
        # The certificate files' mistakes now, in one line naming the file (`tls.load`).
        self.certificates = (
            tls.CertificateFiles(c.tls_cert, c.tls_key, c.tls_client_ca) if c.tls_cert else None
        )
        # Build named pipelines now: a bad spec file fails the start, not a client's stream.
        # The operator's pipelines read any path, within the document limit.
        operator = DataAccess(
            max_document_bytes=int(self.config.max_document_mb * (1 << 20)),
            max_decompressed_bytes=int(self.config.max_decompressed_mb * (1 << 20)),
        )
        for name, spec in self.config.pipelines.items():
            try:
                check_workers(getattr(spec, "spec", spec), self.config.max_workers)
            except InvalidSpecError as e:
                raise InvalidSpecError(f"--pipelines {name!r}: {e}") from None
        pipelines = {
            name: spec if isinstance(spec, Pipeline) else Pipeline(spec, operator)
            for name, spec in self.config.pipelines.items()
        }
        self.drained = False  # set by stop(): whether every stream ended within the grace
        self._draining = threading.Event()
        self._stopped = threading.Event()
        access = DataAccess(
            roots=c.data_roots,
            max_files=c.max_files,
            max_document_bytes=int(c.max_document_mb * (1 << 20)),
            max_decompressed_bytes=int(c.max_decompressed_mb * (1 << 20)),
        )
        limits = Limits(
            access=access, stream_memory_mb=c.stream_memory_mb, max_workers=c.max_workers
        )
        self._servicer = InputServicer(
            pipelines,
            max_streams=c.max_streams,
            queue_depth=c.queue_depth,
            message_tokens=c.message_tokens,
            draining=self._draining,
            limits=limits,
            openings=Openings(cache=TuneCache(c.tune_cache) if c.tune_cache else None),
        )
        # Streams hold a thread each, and a stream whose client left keeps its thread while
        # it closes (its slot already free). Calls still waiting for their request, and calls
        # of the other methods, are capped too (`call_limits`): the pool holds every capped
        # call, and its spare threads answer the refusals beyond the caps.
        calls = CallLimits()
        threads = self._servicer.max_handlers + calls.threads() + SPARE_THREADS
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"),
            interceptors=[*auth.interceptors(policy), calls],
            # A flood of calls beyond the pool waits in its queue; past this gRPC refuses them.
            maximum_concurrent_rpcs=4 * threads,
            options=[
                ("grpc.so_reuseport", 0),
                *[o for o in MESSAGE_OPTIONS if o[0] != "grpc.max_receive_message_length"],
                # Requests are small (a spec); a larger one is refused before it is read.
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                *connection_options(
                    max_connections=max_connections(),
                    streams_per_connection=threads * CONNECTION_CALLS_PCT // 100,
                    handshake_s=HANDSHAKE_S,
                    idle_s=IDLE_S,
                ),
            ],
        )
        add_to_server(self._servicer, self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        credentials = self.certificates and self.certificates.credentials()
        self._probes: grpc.Server | None = None
        self.health_port: int | None = None  # bound, on every interface, when configured
        self.targets: list[str] = []
        self._unix_sockets: list[tuple[str, tuple[int, int]]] = []  # path, (device, inode)
        for a in addresses:
            path = (
                a.bind.removeprefix("unix://").removeprefix("unix:") if a.kind == "file" else None
            )
            try:
                if path is None and credentials is not None and not a.is_unix:
                    port = self._server.add_secure_port(a.bind, credentials)
                elif path is None:
                    port = self._server.add_insecure_port(a.bind)
                else:
                    claim_socket_path(path, a.bind)
                    with auth.owner_only_umask():  # born 0600: no moment open to others
                        port = self._server.add_insecure_port(a.bind)
                    st = os.stat(path)
                    self._unix_sockets.append((path, (st.st_dev, st.st_ino)))
                    auth.share_socket(path, gid, c.socket_group)
            except (RuntimeError, OSError) as e:
                self._server.stop(None)  # release the addresses already bound
                self._remove_own_sockets()
                if isinstance(e, OSError):
                    raise
                raise OSError(f"--listen {a.bind!r}: cannot bind ({e}).") from e
            if a.is_unix:
                self.targets.append(a.bind)
            else:
                if port == 0:
                    self._server.stop(None)
                    self._remove_own_sockets()
                    raise OSError(f"--listen {a.bind!r}: cannot bind (address in use?).")
                self.targets.append(f"{a.host}:{port}")
        if c.health_port is not None:
            try:
                self._probes, self.health_port = probes.health_server(self._health, c.health_port)
            except OSError:
                self._server.stop(None)
                self._remove_own_sockets()
                raise
        if start:
            self.start()

    def start(self) -> None:
        self._server.start()
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self._probes is not None:
            self._probes.start()
        log.info(
            "serving on %s%s%s",
            ", ".join(self.targets),
            " (TCP with TLS)" if self.certificates else "",
            f"; health alone, plaintext, on port {self.health_port}" if self._probes else "",
        )

    def active_streams(self) -> int:
        """Streams being set up, running or closing now (what a drain would end)."""
        return self._servicer.active_requests()

    def stop(self, grace: float | None = None) -> None:
        """Drains and stops; safe to call twice."""
        if self._stopped.is_set():
            return
        grace = self.config.grace_s if grace is None else grace
        self._health.enter_graceful_shutdown()  # NOT_SERVING for the whole drain
        self._draining.set()
        # Streams end with UNAVAILABLE at their next batch or tick; health and info still
        # answer meanwhile (gRPC's own stop refuses every new call at once).
        deadline = time.monotonic() + grace
        while self._servicer.active_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.drained = not self._servicer.active_requests()
        self._server.stop(max(0.0, min(1.0, deadline - time.monotonic()))).wait()
        if self._probes is not None:
            self._probes.stop(None).wait()
        self._remove_own_sockets()
        self._stopped.set()

    def remove_sockets(self) -> None:
        """Removes this server's socket files (for a process about to exit without `stop`)."""
        self._remove_own_sockets()

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
