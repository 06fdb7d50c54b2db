"""A trainer's idle channels are closed by the client before the server's idle limit (issue 27,
H13): the server sends a connection idle for 60 s a GOAWAY, which gRPC's core logged as an
INFO line (`chttp2_transport.cc … Got goaway … connection idle`) in the trainer's process, once
per idle channel: after each eval stream, and for the GetInfo channel.

The server here is the project's real servicer in a gRPC server with the listener's real
connection bounds (`listen.connection_options`) and a short idle limit; the client is a
subprocess (gRPC's core writes to its stderr, with its default verbosity) whose own idle
limit is shortened the way a caller could: `input_client._reconnect.IDLE_S`.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent import futures

import grpc

from input_client.proto import pb_grpc
from input_client.wire import MESSAGE_OPTIONS
from input_server.serving.listen import connection_options
from input_server.serving.service import InputServicer

# gRPC re-arms an idle timer that saw a call in its period, so a connection whose first call
# came just after it opened is closed between one and two idle limits after that call: the
# client's (1 s, gRPC's least) by ~2 s, the server's (3 s) from ~3 s and by ~6 s.
SERVER_IDLE_S = 3.0
CLIENT_IDLE_S = 1.0
PAUSE_S = 2 * SERVER_IDLE_S + 2  # the old client got its GOAWAY within this pause

CHILD = """
import sys, time
import input_client._reconnect
from input_client import InputClient, PipelineSpec
from input_client.proto import pb

input_client._reconnect.IDLE_S = float(sys.argv[3])
spec = PipelineSpec.from_proto(pb.PipelineSpec.FromString(bytes.fromhex(sys.argv[2])))
with InputClient(sys.argv[1], connect_timeout_s=30) as client:
    for stream in range(2):  # a stream, an idle pause as between eval streams, a stream
        with client.batches(spec) as it:
            batch = next(it)
        print("stream", stream, "batch", len(batch["inputs"]), flush=True)
        if stream == 0:
            time.sleep(float(sys.argv[4]))
    print("info", client.info().protocol_version, flush=True)
"""


def _serve(address: str, idle_s: float) -> grpc.Server:
    servicer = InputServicer({}, max_streams=2, queue_depth=2, draining=threading.Event())
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[
            *MESSAGE_OPTIONS,
            *connection_options(
                max_connections=64, streams_per_connection=16, handshake_s=5, idle_s=idle_s
            ),
        ],
    )
    pb_grpc.add_InputServiceServicer_to_server(servicer, server)
    server.add_insecure_port(address)
    server.start()
    return server


def test_an_idle_client_closes_its_channels_before_the_server_sends_goaway(tmp_path, make_spec):
    address = f"unix://{tmp_path}/input.sock"
    server = _serve(address, SERVER_IDLE_S)
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                address,
                make_spec().to_proto().SerializeToString().hex(),
                str(CLIENT_IDLE_S),
                str(PAUSE_S),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop(None)
    assert r.returncode == 0, r.stderr
    # Both streams delivered after the pause, and the GetInfo channel answered: reconnecting
    # after the client's own close is clean.
    assert r.stdout.startswith("stream 0 batch 4\nstream 1 batch 4\ninfo "), r.stdout
    assert "goaway" not in r.stderr.lower(), r.stderr
