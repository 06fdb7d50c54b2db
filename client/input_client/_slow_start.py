"""What a client says when its first batch is slow: one line on what the server is doing."""

from __future__ import annotations

from typing import Any

import grpc

from input_client.proto import pb


def what_the_server_does(stub: Any) -> str:
    """One line on the stream's state, from the server's info (asked with a short deadline)."""
    try:
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=2.0)
    except grpc.RpcError as e:
        return f"the server's info did not answer ({e.code().name})."
    streams = ", ".join(
        f"stream {s.stream_id} ({s.pipeline}): {s.worker_reason}"
        if s.worker_reason.startswith("setting up")
        else f"stream {s.stream_id} ({s.pipeline}): {s.batches_produced} batch"
        f"{'' if s.batches_produced == 1 else 'es'} produced, "
        f"{s.worker_processes} process{'' if s.worker_processes == 1 else 'es'} x "
        f"{s.worker_threads} thread{'' if s.worker_threads == 1 else 's'}"
        + (f" ({s.tuning_state})" if s.tuning_state else "")
        for s in info.streams
    )
    return (
        "the server is still setting this stream up or making its first batch (opening "
        f"files, reading the first groups); streams running now: {streams or 'none'}."
    )
