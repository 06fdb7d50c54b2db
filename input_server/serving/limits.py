"""What one stream may hold and use: the server's limits, and the memory a spec would take."""

from __future__ import annotations

import dataclasses

import grpc

from input_client.spec import PipelineSpec
from input_server.data.roots import DataAccess
from input_server.errors import InvalidSpecError, RefusedError
from input_server.serving.coalesce import batches_per_message

_MIB = 1 << 20
# A batch on the server at its widest: MaxText's six arrays of int32 per token (the packed
# form and the wire form are smaller; this bounds both).
BYTES_PER_TOKEN = 6 * 4
# A group of documents being read and tokenized by one thread: its text (at most
# GROUP_RAW_CHARS) and its tokens.
GROUP_MIB = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """A server's bounds on each request (see `ServerConfig` for each field's meaning)."""

    access: DataAccess
    stream_memory_mb: float
    max_workers: int


def stream_memory_mb(
    spec: PipelineSpec, *, queue_depth: int, message_tokens: int, processes: int, threads: int
) -> float:
    """The most memory a stream of `spec` holds, MiB: the batches queued ahead of the network,
    one message's coalesced batches, the batch being packed and the one being sent, and the
    groups of documents in flight in its workers."""
    b = spec.batch
    batch_mb = b.size * b.seq_len * BYTES_PER_TOKEN / _MIB
    batches = queue_depth + batches_per_message(b.size, b.seq_len, message_tokens) + 2
    groups = max(1, processes) * threads
    return batches * batch_mb + groups * GROUP_MIB


def check_memory(spec: PipelineSpec, limit_mb: float, **shape) -> None:
    """Refuses (RESOURCE_EXHAUSTED) a stream that could hold more than `limit_mb`, naming the
    numbers and the keys to change."""
    need = stream_memory_mb(spec, **shape)
    if need > limit_mb:
        b = spec.batch
        raise RefusedError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the stream would hold up to {need:,.0f} MiB (batch.size {b.size} x batch.seq_len "
            f"{b.seq_len} x {BYTES_PER_TOKEN} bytes per token x {shape['queue_depth']} queued "
            f"batches and more), over the server's --stream-memory-mb {limit_mb:g}; lower "
            f"`batch.size` or `batch.seq_len`, or ask the operator for a larger budget.",
        )


def check_workers(spec: PipelineSpec, cap: int) -> None:
    """Refuses a fixed `workers.count` above the server's cap (INVALID_ARGUMENT)."""
    count = spec.workers.count
    if count != "auto" and count > cap:
        raise InvalidSpecError(
            f"`workers.count` {count} is over the server's --max-workers "
            f"{cap} (worker processes across all streams); ask for at most "
            f'{cap}, or "auto".'
        )
