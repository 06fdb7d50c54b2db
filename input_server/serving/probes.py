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
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2_grpc

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
    for bind in (f"[::]:{port}", f"0.0.0.0:{port}"):  # IPv4 alone: a host without IPv6
        try:
            bound = server.add_insecure_port(bind)
        except RuntimeError:
            bound = 0
        if bound:
            return server, bound
    server.stop(None)
    raise OSError(f"--health-port {port}: cannot bind it on every interface (in use?).")
