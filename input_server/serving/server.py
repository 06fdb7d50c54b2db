"""Server lifecycle: the gRPC server on its listen addresses (TLS on TCP where configured),
health checking (and its plaintext probe port), draining stop."""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from input_client.addresses import socket_path
from input_client.proto import pb
from input_client.wire import MESSAGE_OPTIONS
from input_server.autotune.openings import Openings
from input_server.autotune.remembered import TuneCache
from input_server.batching.pipeline import Pipeline
from input_server.data.records import configure_open_files
from input_server.data.roots import DataAccess
from input_server.data.tokenizers.keep import keep_in
from input_server.errors import InvalidSpecError
from input_server.serving import auth, probes, socket_lock, tls, warm
from input_server.serving.auth import default_socket
from input_server.serving.call_limits import CallLimits
from input_server.serving.config import ServerConfig
from input_server.serving.limits import Limits, check_workers
from input_server.serving.listen import (  # noqa: F401
    Address,
    add_port,
    check_socket_folder,
    claim_socket_path,
    connection_options,
    parse_address,
    tcp_refused,
)
from input_server.serving.service import InputServicer, add_to_server
from input_server.serving.socket_lock import SocketLock

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
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


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

    def __init__(
        self,
        config: ServerConfig | None = None,
        *,
        start: bool = True,
        waiting: Callable[[list[str]], None] | None = None,
    ):
        self.config = c = config or ServerConfig()
        self._locks: list[SocketLock] = []  # the socket files' (`_lock_socket_files`)
        self.targets: list[str] = []
        self._unix_sockets: list[tuple[str, tuple[int, int]]] = []  # path, (device, inode)
        addresses = self._addresses()
        # Descriptors: the soft limit raised to the hard one, and the share readers keep.
        configure_open_files(c.max_open_files)
        if not c.listen:  # other users must not reach the folder of the default
            auth.ensure_private_dir(auth.default_socket_dir())
        # Who may connect, decided before anything is built or bound: a mistake is one line.
        gid = auth.socket_gid(c.socket_group)
        policy = auth.token_policy(
            {a.kind: a.bind for a in addresses},
            token_file=c.token_file,
            insecure_tcp=c.insecure_tcp,
            insecure_abstract=c.insecure_abstract,
        )
        # The certificate files' mistakes now, in one line naming the file (`tls.load`).
        self.certificates = (
            tls.CertificateFiles(c.tls_cert, c.tls_key, c.tls_client_ca) if c.tls_cert else None
        )
        self.token_cache = None
        if c.token_cache:  # made before the pipelines, which read through it
            from input_server.data.token_cache import TokenCache

            self.token_cache = TokenCache(c.token_cache, int(c.token_cache_gb * (1 << 30)))
        # Before the pipelines, whose tokenizers read it; a folder others may write into is
        # refused, one that cannot be made (a read-only home) leaves it in memory.
        self.tokenizer_cache = keep_in(c.tokenizer_cache) if c.tokenizer_cache else None
        pipelines = self._build_pipelines()
        self.drained = False  # set by stop(): whether every stream ended within the grace
        self._draining = threading.Event()
        self._stopped = threading.Event()
        self._servicer = self._make_servicer(pipelines)
        self._health = health.HealthServicer()
        # The abstract sockets, beside other listeners, on a gRPC server of their own, which
        # shares the services, the call caps and the thread pool (`TokenPolicy.split`).
        apart = {a.kind == "abstract" for a in addresses} == {True, False}
        policies = policy.split() if apart else (policy,)
        self._server, *others = self._make_grpc_servers(policies)
        self._abstract_server = others[0] if others else None
        self._metrics = None  # bound after the locks: a standby shares its server's port
        self._locks = self._lock_socket_files(addresses, waiting)
        self._metrics = self._metrics_endpoint()
        self._probes: grpc.Server | None = None
        self.health_port: int | None = None  # bound, on every interface, when configured
        # The metrics page's port, bound (`--metrics-port`; 0 picks one).
        self.metrics_port = self._metrics.port if self._metrics else None
        credentials = self.certificates and self.certificates.credentials()
        for a in addresses:
            self._listen_on(a, credentials, gid)
        self._check: probes.SelfCheck | None = None
        if c.health_port is not None:
            try:
                self._probes, self.health_port = probes.health_server(self._health, c.health_port)
                # The probe port answers from threads of its own: it says what this checks.
                self._check = probes.SelfCheck(
                    self._health, self._server, self.targets, ("", SERVICE_NAME)
                )
            except OSError:
                if self._probes is not None:
                    self._probes.stop(None)
                self._unbind()
                raise
        if start:
            self.start()

    def _lock_socket_files(
        self, addresses: list[Address], waiting: Callable[[list[str]], None] | None
    ) -> list[SocketLock]:
        """Each socket file's lock (`socket_lock`), taken before its path is claimed: a standby
        (`config.standby`), everything loaded, tells `waiting` the addresses, then waits until
        it can take their locks all at once; a server refuses a path whose lock another
        process holds."""
        said = {}
        for a in addresses:
            if a.kind != "file":
                continue
            lock = SocketLock(socket_path(a.bind))
            name = f"--listen {a.bind}" if self.config.listen else f"the default socket {a.bind}"
            if lock.file in said:
                self._unbind()
                raise OSError(
                    f"{name}: the same socket file as {said[lock.file][1]}; give it once."
                )
            said[lock.file] = (lock, name)
        locks = [lock for lock, _ in said.values()]
        try:
            for lock, name in said.values():
                check_socket_folder(lock.path, name)  # before its lock file is made there
            if self.config.standby:
                warm.load()  # nothing answers here yet: Grain's import swaps no call's imports
                names = [name for _, name in said.values()]
                log.info("standby: waiting for its server to end (%s)", ", ".join(names))
                if waiting is not None:
                    waiting(names)
                socket_lock.wait_for_all(locks)
                return locks
            held = next((name for lock, name in said.values() if not lock.take()), None)
        except OSError:
            self._unbind()
            raise
        if held is not None:
            for lock in locks:
                lock.release()
            self._unbind()
            raise OSError(
                f"{held}: in use by a running server, or a standby taking it over; stop it "
                f"first, listen on another path, or add --standby to wait as its spare."
            )
        return locks

    def _addresses(self) -> list[Address]:
        """The addresses to listen on, refused where their exposure lacks TLS or a token."""
        c = self.config
        addresses = [parse_address(a) for a in (c.listen or [default_socket()])]
        tls.check_exposure(
            addresses,
            tls=c.tls_cert is not None,
            token_file=c.token_file,
            insecure_tcp=c.insecure_tcp,
        )
        if c.tls_cert and all(a.is_unix for a in addresses):
            log.warning("--tls-cert: no TCP listener to use it on; Unix sockets stay plaintext")
        return addresses

    def _build_pipelines(self) -> dict[str, Pipeline]:
        """The named pipelines, built now: a bad spec file fails the start, not a client's
        stream. The operator's pipelines read any path, within the document limit."""
        c = self.config
        operator = DataAccess(
            max_document_bytes=int(c.max_document_mb * (1 << 20)),
            max_decompressed_bytes=int(c.max_decompressed_mb * (1 << 20)),
            tokenizing_budget=int(c.stream_memory_mb * (1 << 20)),
        )
        for name, spec in c.pipelines.items():
            try:
                check_workers(spec.spec if isinstance(spec, Pipeline) else spec, c.max_workers)
            except InvalidSpecError as e:
                raise InvalidSpecError(f"--pipelines {name!r}: {e}") from None
        return {
            name: spec
            if isinstance(spec, Pipeline)
            else Pipeline(
                spec,
                operator,
                audit_every=self.config.tokenizer_audit_every,
                token_cache=self.token_cache,
                tokenizer_cache=self.tokenizer_cache,
            )
            for name, spec in c.pipelines.items()
        }

    def _metrics_endpoint(self):
        """The metrics page (`--metrics-port`), bound now: a port in use fails the start.
        prometheus-client is imported only for it."""
        c = self.config
        if c.metrics_port is None:
            return None
        from input_server.serving.metrics import MetricsEndpoint

        try:
            return MetricsEndpoint(
                self._servicer.info, host=c.metrics_host or "127.0.0.1", port=c.metrics_port
            )
        except OSError:
            for server in self._grpc_servers():
                server.stop(None)
            raise

    def _grpc_servers(self) -> list[grpc.Server]:
        return [s for s in (self._server, self._abstract_server) if s is not None]

    def _make_servicer(self, pipelines: dict[str, Pipeline]) -> InputServicer:
        c = self.config
        access = DataAccess(
            roots=c.data_roots,
            max_files=c.max_files,
            max_document_bytes=int(c.max_document_mb * (1 << 20)),
            max_decompressed_bytes=int(c.max_decompressed_mb * (1 << 20)),
            tokenizing_budget=int(c.stream_memory_mb * (1 << 20)),
        )
        limits = Limits(
            access=access, stream_memory_mb=c.stream_memory_mb, max_workers=c.max_workers
        )
        return InputServicer(
            pipelines,
            max_streams=c.max_streams,
            queue_depth=c.queue_depth,
            message_tokens=c.message_tokens,
            audit_every=c.tokenizer_audit_every,
            token_cache=self.token_cache,
            tokenizer_cache=self.tokenizer_cache,
            draining=self._draining,
            limits=limits,
            openings=Openings(cache=TuneCache(c.tune_cache) if c.tune_cache else None),
        )

    def _make_grpc_servers(self, policies: tuple[auth.TokenPolicy, ...]) -> list[grpc.Server]:
        """gRPC's servers, one a token policy, with the services: their one thread pool
        sized for every capped call, the caps shared (one `CallLimits`)."""
        # Streams hold a thread each, and a stream whose client left keeps its thread while
        # it closes (its slot already free). Calls still waiting for their request, and calls
        # of the other methods, are capped too (`call_limits`): the pool holds every capped
        # call, and its spare threads answer the refusals beyond the caps.
        calls = CallLimits()
        threads = self._servicer.max_handlers + calls.threads() + SPARE_THREADS
        pool = futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc")
        servers = [self._make_grpc_server(p, pool, calls, threads) for p in policies]
        for server in servers:
            add_to_server(self._servicer, server)
            health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
            # `grpcurl -unix -plaintext SOCKET list`: behind the token like InputService
            # (only health is open, `auth.OPEN_METHODS`), and under `call_limits.OTHER_CAP`.
            reflection.enable_server_reflection(
                (SERVICE_NAME, HEALTH_SERVICE, reflection.SERVICE_NAME), server
            )
        return servers

    @staticmethod
    def _make_grpc_server(
        policy: auth.TokenPolicy, pool: futures.ThreadPoolExecutor, calls: CallLimits, threads: int
    ) -> grpc.Server:
        return grpc.server(
            pool,
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

    def _listen_on(self, a: Address, credentials, gid) -> None:
        """Binds `a` (TLS on TCP with `credentials`; a socket file born 0600, then shared with
        `gid`) and adds its target; on a failure, releases what was bound before raising."""
        path = socket_path(a.bind) if a.kind == "file" else None
        refused = None if a.is_unix else tcp_refused()
        if refused:  # before gRPC's core logs the address it failed to bind
            self._unbind()
            raise OSError(
                f"--listen {a.bind!r}: {refused}; listen on a Unix socket instead "
                f"(unix:///PATH.sock, or leave out --listen for the default one)."
            )
        # A default socket was not asked for by --listen: its messages say which it is.
        said = f"--listen {a.bind}" if self.config.listen else f"the default socket {a.bind}"
        server = self._abstract_server if a.kind == "abstract" else None
        server = server or self._server
        try:
            if path is None and credentials is not None and not a.is_unix:
                port = add_port(lambda: server.add_secure_port(a.bind, credentials), said, a)
            elif path is None:
                port = add_port(lambda: server.add_insecure_port(a.bind), said, a)
            else:
                claim_socket_path(path, said)
                with auth.owner_only_umask():  # born 0600: no moment open to others
                    port = add_port(lambda: server.add_insecure_port(a.bind), said, a)
                st = os.stat(path)
                self._unix_sockets.append((path, (st.st_dev, st.st_ino)))
                auth.share_socket(path, gid, self.config.socket_group)
        except OSError:
            self._unbind()
            raise
        self.targets.append(a.bind if a.is_unix else f"{a.host}:{port}")

    def _unbind(self) -> None:
        """Releases the addresses already bound, for a start that failed."""
        for server in self._grpc_servers():
            server.stop(None)
        if self._metrics is not None:
            self._metrics.stop()
        self._remove_own_sockets()
        for lock in self._locks:
            lock.release()

    def start(self) -> None:
        if not warm.load_behind():  # Grain, which every stream needs, behind the socket;
            warm.load()  # or, where its lazy imports cannot be made its own, before any call
        for server in self._grpc_servers():
            server.start()
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self._probes is not None:
            self._probes.start()
        if self._check is not None:
            self._check.start()
        if self._metrics is not None:
            self._metrics.start()
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
        if self._check is not None:
            self._check.stop()
        self._health.enter_graceful_shutdown()  # NOT_SERVING for the whole drain
        self._draining.set()
        # Streams end with UNAVAILABLE now (`drain` wakes them); health and info still
        # answer meanwhile (gRPC's own stop refuses every new call at once).
        self._servicer.drain()
        deadline = time.monotonic() + grace
        while self._servicer.active_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.drained = not self._servicer.active_requests()
        left = max(0.0, min(1.0, deadline - time.monotonic()))
        for stopped in [server.stop(left) for server in self._grpc_servers()]:
            stopped.wait()
        if self._probes is not None:
            self._probes.stop(None).wait()
        if self._metrics is not None:
            self._metrics.stop()
        self._remove_own_sockets()
        for lock in self._locks:  # a standby takes over from here
            lock.release()
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
