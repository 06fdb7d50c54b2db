"""What one stream may hold and use: the server's limits, and the memory a spec would take."""

from __future__ import annotations

import dataclasses
import os

import grpc

from input_client.spec import PipelineSpec
from input_server.batching.parallelism import Parallelism
from input_server.data.order import OrderBudget
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


class StreamProcesses:
    """One "auto" stream's view of the server's worker processes (`slots.ProcessPool`), held to
    `cap` at once: each worker process computes its own copy of the stream's document order,
    which its tuning (measuring memory once the processes run) would learn of too late.

    Args:
      pool: the server's processes.
      cap: the most this stream may hold; None = as many as are free.
    """

    def __init__(self, pool, cap: int | None):
        self._pool, self._cap, self._held = pool, cap, 0
        self.cap = pool.cap  # the server's --max-workers, for messages

    def _room(self, n: int) -> int:
        return n if self._cap is None else max(0, min(n, self._cap - self._held))

    def free(self) -> int:
        return self._room(self._pool.free())

    def take_up_to(self, n: int) -> int:
        got = self._pool.take_up_to(self._room(n))
        self._held += got
        return got

    def give(self, n: int) -> None:
        self._held -= n
        self._pool.give(n)


def check_fits(spec: PipelineSpec, limits: Limits, *, queue_depth: int, message_tokens: int):
    """Refuses a spec over the server's worker cap, or over its memory budget with the
    parallelism it asks for ("auto": the least; tuning then keeps within the rest), its
    tokenizer model's copies in its worker processes counted."""
    check_workers(spec, limits.max_workers)
    count = spec.workers.count
    shape = {
        "queue_depth": queue_depth,
        "message_tokens": message_tokens,
        "processes": 0 if count == "auto" else count,
        "threads": 1 if count == "auto" else Parallelism.fixed(count, spec.workers.threads).threads,
    }
    check_memory(spec, limits.stream_memory_mb, **shape)
    check_model_copies(spec, limits, stream_memory_mb(spec, **shape), shape["processes"])


def model_copy_mb(spec: PipelineSpec, access: DataAccess) -> tuple[float, float]:
    """(file MiB, loaded MiB) of one process's copy of `spec`'s Hugging Face model by the
    reference's estimate (the server's own copy is shared by its streams and bounded apart,
    `huggingface.MAX_LOADED_BYTES`); (0, 0) for other kinds, or a model not found yet
    (opening the pipeline says why)."""
    from input_server.data.tokenizers import huggingface
    from input_server.data.tokenizers.registry import resolve_model
    from input_server.errors import InputServerError

    if not spec.tokenizer.model or spec.tokenizer.kind != huggingface.HuggingFaceTokenizer.KIND:
        return 0.0, 0.0
    try:
        path, _ = resolve_model(access, spec.tokenizer)
        size = os.path.getsize(path)
    except (InputServerError, OSError):
        return 0.0, 0.0
    return size / _MIB, size * huggingface.LOAD_BYTES_PER_FILE_BYTE / _MIB


def check_model_copies(spec: PipelineSpec, limits: Limits, used_mb: float, processes: int):
    """Refuses (RESOURCE_EXHAUSTED) a stream whose worker processes, each loading its own copy
    of the tokenizer model, would take it past --stream-memory-mb: a 118 MB tokenizer.json
    takes ~1.9 GB a process."""
    if processes <= 0:
        return
    file_mb, copy_mb = model_copy_mb(spec, limits.access)
    need = used_mb + processes * copy_mb
    if need <= limits.stream_memory_mb:
        return
    fit = max(0, int((limits.stream_memory_mb - used_mb) // copy_mb))
    raise RefusedError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"`tokenizer.model` {spec.tokenizer.model!r} ({file_mb:,.1f} MB) loads in each of the "
        f"stream's {processes} worker processes at about {copy_mb:,.0f} MB "
        f"({copy_mb / file_mb:.0f} x the file): {need:,.0f} MB with its batches, over the server's "
        f"--stream-memory-mb {limits.stream_memory_mb:g}; ask for at most {fit} in "
        f"`workers.count` (0 tokenizes in the server, whose copy streams share), or ask the "
        f"operator for a larger budget.",
    )


def groups_mb(pipeline, limits: Limits, *, queue_depth: int, message_tokens: int) -> float:
    """The memory a stream's groups in flight (and worker processes, measured) may use: its
    spec's `ram_budget_mb`, within what the batches and the server's copy of its document
    order leave of the server's budget for a stream."""
    spec = pipeline.spec
    order_mb = order_bytes(pipeline) / _MIB
    return min(
        spec.workers.ram_budget_mb,
        limits.stream_memory_mb
        - order_mb
        - stream_memory_mb(
            spec,
            queue_depth=queue_depth,
            message_tokens=message_tokens,
            processes=0,
            threads=0,
        ),
    )


def order_process_cap(order_bytes: int, left_mb: float) -> int | None:
    """The worker processes whose copies of a document order of `order_bytes` fit in
    `left_mb` (what the stream's budget leaves); None when the order holds nothing."""
    if order_bytes <= 0 or left_mb == float("inf"):
        return None
    return max(0, int(left_mb * _MIB // order_bytes))


def order_budget(
    spec: PipelineSpec, limit_mb: float, *, queue_depth: int, message_tokens: int
) -> OrderBudget | None:
    """What `spec`'s batches and groups leave of a stream's `limit_mb` (--stream-memory-mb) for
    its document order, 4 bytes a document of its shard (8 from 2**32 documents) in the
    server's process and in each worker process (800 M documents of one file named 40,000
    times took a 3 GB server down);
    checked once its files are counted, before the order is computed. None: no limit."""
    if limit_mb == float("inf"):
        return None
    count = spec.workers.count
    # "auto" starts in the server's process; its worker processes are held to the copies
    # that fit (`StreamProcesses`).
    processes = 0 if count == "auto" else count
    threads = 1 if count == "auto" else Parallelism.fixed(count, spec.workers.threads).threads
    used = stream_memory_mb(
        spec,
        queue_depth=queue_depth,
        message_tokens=message_tokens,
        processes=processes,
        threads=threads,
    )
    return OrderBudget(
        max_bytes=int((limit_mb - used) * _MIB), copies=1 + processes, flag_mb=limit_mb
    )


def order_bytes(pipeline, position=None) -> int:
    """What one process's copy of a pipeline's document order holds at most; from `position`
    on, whose order may be a resharded state's (the old hosts' permutations too)."""
    order = getattr(position, "order", None) or getattr(pipeline, "order", None)
    orders = getattr(order, "components", None) or ([order] if order is not None else [])
    return sum(o.held_bytes() for o in orders if hasattr(o, "held_bytes"))


def access_for(
    spec: PipelineSpec, limits: Limits, *, queue_depth: int, message_tokens: int
) -> DataAccess:
    """The server's data access for a request of `spec`, with its `order_budget`."""
    budget = order_budget(
        spec, limits.stream_memory_mb, queue_depth=queue_depth, message_tokens=message_tokens
    )
    if budget is None:
        return limits.access
    return dataclasses.replace(limits.access, order_budget=budget)
