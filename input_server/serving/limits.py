"""What one stream may hold and use: the server's limits, and the refusals of a spec over them
(the memory arithmetic is `batching/footprint.py`'s)."""

from __future__ import annotations

import dataclasses
import os

import grpc

from input_client.spec import PipelineSpec
from input_server.batching.footprint import BYTES_PER_TOKEN, MIB, stream_memory_mb
from input_server.batching.parallelism import Parallelism
from input_server.data.order import OrderBudget
from input_server.data.roots import DataAccess
from input_server.errors import InvalidSpecError, RefusedError
from input_server.serving.coalesce import batches_per_message


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """A server's bounds on each request (see `ServerConfig` for each field's meaning)."""

    access: DataAccess
    stream_memory_mb: float
    max_workers: int


def _stream_mb(
    spec: PipelineSpec, *, queue_depth: int, message_tokens: int, processes: int, threads: int
) -> float:
    """`footprint.stream_memory_mb` with one message of the server's `message_tokens`."""
    b = spec.batch
    return stream_memory_mb(
        spec,
        queue_depth=queue_depth,
        per_message=batches_per_message(b.size, b.seq_len, message_tokens),
        processes=processes,
        threads=threads,
    )


def check_memory(spec: PipelineSpec, limit_mb: float, **shape) -> None:
    """Refuses (RESOURCE_EXHAUSTED) a stream that could hold more than `limit_mb`, naming the
    numbers and the keys to change."""
    need = _stream_mb(spec, **shape)
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
    check_model_copies(spec, limits, _stream_mb(spec, **shape), shape["processes"])


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
    return size / MIB, size * huggingface.LOAD_BYTES_PER_FILE_BYTE / MIB


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
    # that fit (`slots.ProcessReservation`).
    processes = 0 if count == "auto" else count
    threads = 1 if count == "auto" else Parallelism.fixed(count, spec.workers.threads).threads
    used = _stream_mb(
        spec,
        queue_depth=queue_depth,
        message_tokens=message_tokens,
        processes=processes,
        threads=threads,
    )
    return OrderBudget(
        max_bytes=int((limit_mb - used) * MIB), copies=1 + processes, flag_mb=limit_mb
    )


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
