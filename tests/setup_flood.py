"""A client flooding a server's set-up queue, run as a process of its own (its threads and its
interpreter apart from the test's honest client):

setup_flood.py TARGET REQUEST_FILE THREADS [CLIENT]
    THREADS threads each send the serialized StreamBatchesRequest in REQUEST_FILE on a channel
    of its own, wait for its first message or its status, and send it again at once, until
    killed. Each outcome is printed as it comes: {"t": seconds since the start, "code": "OK"
    or the status's name, "details": its text}. CLIENT: the client name every call sends
    (`wire.CLIENT_KEY`); none by default, as a raw gRPC client sends.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import grpc

from input_client.proto import pb, pb_grpc
from input_client.wire import CLIENT_KEY

_lock = threading.Lock()
_start = time.monotonic()


def _say(code: str, details: str) -> None:
    with _lock:
        print(json.dumps({"t": time.monotonic() - _start, "code": code, "details": details}))
        sys.stdout.flush()


def _flood(target: str, request: pb.StreamBatchesRequest, metadata: tuple) -> None:
    while True:
        with grpc.insecure_channel(target) as channel:
            call = pb_grpc.InputServiceStub(channel).StreamBatches(
                iter([request]), timeout=300, metadata=metadata
            )
            try:
                next(call)
                _say("OK", "")
            except grpc.RpcError as e:
                _say(e.code().name, e.details() or "")
            call.cancel()


def main(argv: list[str]) -> None:
    target, path, threads = argv[0], argv[1], int(argv[2])
    metadata = ((CLIENT_KEY, argv[3]),) if len(argv) > 3 else ()
    with open(path, "rb") as f:
        request = pb.StreamBatchesRequest.FromString(f.read())
    for _ in range(threads):
        threading.Thread(target=_flood, args=(target, request, metadata), daemon=True).start()
    _say("STARTED", f"{threads} threads")
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
