"""`--health-port`: a plaintext port on every interface that serves only gRPC health, for probes
that can speak neither TLS nor a token (Kubernetes' `grpc:` probe) and for a Unix-socket
sidecar's probes, which dial the pod's IP.

Kubernetes' docs ("Configure Liveness, Readiness and Startup Probes", gRPC probes, GA in 1.27):
built-in gRPC probes run against the pod IP and "do not support any authentication parameters
(like `-tls`)"; KEP-2727 adds that the kubelet "will not allow use of client certificates nor
verify the certificate". (KEP-4939's `mode: TLS`, alpha in 1.37, still sends no client
certificate and no token.) So a TLS listener, let alone a mutual-TLS one, cannot be probed
directly. The port shares the server's `HealthServicer`: a drain shows NOT_SERVING here too.
It says SERVING or not and nothing else; any other method is UNIMPLEMENTED.

Its answer is kept honest by `SelfCheck`: this port has threads of its own, so it would answer
SERVING for a main server that cannot serve (once, 38 s after a flood had left, every call on
the main port failed and a running stream sent nothing while this port said SERVING).
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from input_server.serving import listen
from input_server.serving.call_limits import CallLimits

log = logging.getLogger(__name__)

# A health request is a service name: anything bigger is refused before it is read.
MAX_REQUEST_BYTES = 4 << 10
SPARE_THREADS = 2
# What peers may hold here, none of them authenticated (`listen.connection_options`). A
# kubelet probe is one call on a new connection, closed after it: 16 connections of 2 calls
# each are 32 calls at most, fewer than the pool's threads, so a peer flooding this port on
# a few connections holds a few of them, and a probe on its own connection finds one free.
MAX_CONNECTIONS = 16
STREAMS_PER_CONNECTION = 2
CONNECTIONS = listen.connection_options(
    max_connections=MAX_CONNECTIONS,
    streams_per_connection=STREAMS_PER_CONNECTION,
    handshake_s=2.0,  # plaintext: no handshake to wait for
    # A probe is one call on a connection of its own: a connection with no call for a second
    # is a peer holding one of the places (sockets that sent nothing held them for 5 s).
    idle_s=1.0,
    age_s=60.0,  # a health Watch reconnects: no peer keeps one of the 16 places for long
    age_grace_s=5.0,
)


def health_server(servicer: health.HealthServicer, port: int) -> tuple[grpc.Server, int]:
    """A gRPC server of `servicer` alone on `port` of every interface (IPv6 and IPv4 where the
    host has IPv6, else IPv4), not started; and the port bound (a free one for 0).

    Its own thread pool, with the main server's caps on calls per method: a stream holding
    every thread of the main pool cannot starve a probe, nor can silent calls on this port.

    Raises:
      OSError: the port cannot be bound (in use?), or the host refuses TCP.
    """
    refused = listen.tcp_refused()
    if refused:  # before gRPC's core logs each address it failed to bind
        raise OSError(
            f"--health-port {port}: {refused}, and probes dial TCP; leave out --health-port "
            f"(a probe on the same host can run `input-server info` on the Unix socket)."
        )
    threads = CallLimits.threads() + SPARE_THREADS
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="health"),
        interceptors=[CallLimits()],
        maximum_concurrent_rpcs=2 * threads,
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            *CONNECTIONS,
        ],
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    said = f"--health-port {port}"
    for bind in (f"[::]:{port}", f"0.0.0.0:{port}"):  # IPv4 alone: a host without IPv6
        try:  # one line for a port in use, not gRPC core's log line
            add = functools.partial(server.add_insecure_port, bind)
            return server, listen.add_port(add, said, listen.parse_address(bind))
        except OSError as e:
            failure = e
    server.stop(None)
    raise failure


# The self-check: a health Check on the main server, every CHECK_EVERY_S, over a connection of
# its own. Why a call, and not a look at the thread pool: a call is what a client needs, and
# it fails for every way the server can be unable to serve: no descriptor for a connection,
# no pool thread for a call, gRPC's own loop gone (its pool failing to start a thread takes
# that loop down for good: `grpc/_server.py`, `_process_event_and_continue`). It costs a Unix
# socket's connection and one call (about a millisecond) every 2 s.
CHECK_EVERY_S = 2.0
# An answer later than this is no answer: GetInfo and health must answer within 2.5 s under
# the floods the project is tested with (docs/security.md).
CHECK_DEADLINE_S = 2.0
# Failures in a row before NOT_SERVING (4 to 6 s): one late answer on a loaded host is not a
# server that cannot serve. One answer brings SERVING back.
CHECK_FAILURES = 3


class SelfCheck:
    """Sets `services` NOT_SERVING in `servicer` while the main server does not answer a
    health Check within `CHECK_DEADLINE_S`, `CHECK_FAILURES` times in a row, and SERVING
    again once it answers; a drain's NOT_SERVING stays (`HealthServicer` ignores `set` then).

    It dials the first socket file among `targets`; without one it adds a socket of its own
    to `server` (not started yet), in a private folder, plaintext and owner-only: TLS and
    client certificates would be the check's to hold, and health needs no token.

    Args:
      servicer: the health state the probe port and the main server share.
      server: the main gRPC server, not started.
      targets: the addresses it listens on (`Server.targets`).
      services: the service names whose status follows the check.
    """

    def __init__(
        self,
        servicer: health.HealthServicer,
        server: grpc.Server,
        targets: Sequence[str],
        services: Sequence[str],
    ):
        self._servicer, self._services = servicer, tuple(services)
        self._folder = None
        files = [t for t in targets if t.startswith("unix:") and not t.startswith("unix-abstract")]
        if files:
            self.target = files[0]
        else:
            self._folder = tempfile.mkdtemp(prefix="input-server-check-")  # 0700
            self.target = f"unix://{self._folder}/check.sock"
            if not server.add_insecure_port(self.target):
                shutil.rmtree(self._folder, ignore_errors=True)
                raise OSError(f"--health-port: cannot bind the self-check's {self.target}.")
        self.serving = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="health-check", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the checks and removes the private socket's folder; safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _run(self) -> None:
        failures, due = 0, time.monotonic() + CHECK_EVERY_S
        # Every CHECK_EVERY_S from the last one's start: a check that waits out its deadline
        # does not slow the next (3 failures are 6 s, not 12).
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = time.monotonic() + CHECK_EVERY_S
            why = self.check()
            failures = 0 if why is None else failures + 1
            serving = failures < CHECK_FAILURES
            if serving == self.serving or self._stop.is_set():
                continue
            self.serving = serving
            status = health_pb2.HealthCheckResponse.SERVING
            if serving:
                log.warning("health: SERVING again: the server answers its health check")
            else:
                status = health_pb2.HealthCheckResponse.NOT_SERVING
                log.error(
                    "health: NOT_SERVING: the server did not answer a health check within "
                    "%g s, %d times in a row (last: %s); a probe will restart it",
                    CHECK_DEADLINE_S,
                    failures,
                    why,
                )
            for service in self._services:
                self._servicer.set(service, status)

    def check(self) -> str | None:
        """One health Check on the main server, over a new connection (one that cannot be
        made is a failure too): None when it answered, else why not."""
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]
        try:
            with grpc.insecure_channel(self.target, options=options) as channel:
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=CHECK_DEADLINE_S
                )
        except grpc.RpcError as e:
            return f"{e.code().name}: {(e.details() or '').strip()}"
        except Exception as e:  # no thread or descriptor for the channel: starved as well
            return f"{type(e).__name__}: {e}"
        return None
