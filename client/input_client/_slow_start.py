"""What a client says when its first batch is slow: one line on what the server is doing."""

from __future__ import annotations

from typing import Any

import grpc

from input_client.proto import pb


def _plural(n: int, word: str, many: str | None = None) -> str:
    """`input_server.plurals.plural`'s words: the client is installed without the server."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def _making(s: Any) -> bool:
    """Whether a stream has no batch yet: still setting up, or making its first."""
    return s.worker_reason.startswith("setting up") or not s.batches_produced


def _stream_words(s: Any) -> str:
    """One stream's state: its set-up step, its first batch in the making, or its batches."""
    head = f"stream {s.stream_id} ({s.pipeline})"
    if s.worker_reason.startswith("setting up"):
        return f"{head}: {s.worker_reason}"
    workers = (
        f"{_plural(s.worker_processes, 'process', 'processes')} x "
        f"{_plural(s.worker_threads, 'thread')}"
        + (f" ({s.tuning_state})" if s.tuning_state else "")
    )
    if not s.batches_produced:
        return f"{head}: making its first batch, {workers}"
    made = _plural(s.batches_produced, "batch", "batches")
    return f"{head}: {made} produced, {s.batches_sent:,} sent, {workers}"


def what_the_server_does(stub: Any) -> str:
    """One line on the server's streams, from its info (asked with a short deadline): whether
    one is still setting up or making its first batch, or every one has batches already (the
    wait is then past the server: a batch on its way, or decoded and placed here)."""
    try:
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=2.0)
    except grpc.RpcError as e:
        return f"the server's info did not answer ({e.code().name})."
    if not info.streams:
        return "the server lists no stream running."
    if any(_making(s) for s in info.streams):
        lead = (
            "the server is still setting a stream up or making its first batch (opening "
            "files, reading the first groups)"
        )
    else:
        lead = (
            "the server has batches on every stream it lists, so this one's first is on its "
            "way or being decoded and placed on the devices here (a first placement starts "
            "JAX's backend)"
        )
    streams = "; ".join(_stream_words(s) for s in info.streams)
    return f"{lead}; streams running now: {streams}."
