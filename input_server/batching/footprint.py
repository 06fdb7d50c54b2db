"""A stream's memory at its most: its batches, its groups of documents in flight and the copies
of its document order (what `serving/limits.py` holds a stream to)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from input_client.spec import PipelineSpec

if TYPE_CHECKING:
    from input_server.batching.pipeline import Pipeline
    from input_server.batching.resume import Position

MIB = 1 << 20
# A batch on the server at its widest: MaxText's six arrays of int32 per token (the packed
# form and the wire form are smaller; this bounds both).
BYTES_PER_TOKEN = 6 * 4
# A group of documents being read and tokenized by one thread: its text (at most
# GROUP_RAW_CHARS) and its tokens.
GROUP_MIB = 8


def stream_memory_mb(
    spec: PipelineSpec, *, queue_depth: int, per_message: int, processes: int, threads: int
) -> float:
    """The most memory a stream of `spec` holds, MiB: the `queue_depth` batches queued ahead of
    the network, one message's `per_message` coalesced batches (`serving.coalesce`), the batch
    being packed and the one being sent, and the groups of documents in flight in its workers.
    """
    b = spec.batch
    batch_mb = b.size * b.seq_len * BYTES_PER_TOKEN / MIB
    batches = queue_depth + per_message + 2
    groups = max(1, processes) * threads
    return batches * batch_mb + groups * GROUP_MIB


def order_bytes(pipeline: Pipeline, position: Position | None = None) -> int:
    """What one process's copy of a pipeline's document order holds at most; from `position`
    on, whose order may be a resharded state's (the old hosts' permutations too)."""
    order = pipeline.order if position is None or position.order is None else position.order
    return order.held_bytes()


def groups_mb(pipeline: Pipeline, limit_mb: float, *, queue_depth: int, per_message: int) -> float:
    """The memory a stream's groups in flight (and worker processes, measured) may use: its
    spec's `ram_budget_mb`, within what the batches and the server's copy of its document
    order leave of `limit_mb`, the server's budget for a stream."""
    spec = pipeline.spec
    batches_mb = stream_memory_mb(
        spec, queue_depth=queue_depth, per_message=per_message, processes=0, threads=0
    )
    return min(spec.workers.ram_budget_mb, limit_mb - order_bytes(pipeline) / MIB - batches_mb)


def order_process_cap(order_bytes: int, left_mb: float) -> int | None:
    """The worker processes whose copies of a document order of `order_bytes` fit in
    `left_mb` (what the stream's budget leaves); None when the order holds nothing."""
    if order_bytes <= 0 or left_mb == float("inf"):
        return None
    return max(0, int(left_mb * MIB // order_bytes))
