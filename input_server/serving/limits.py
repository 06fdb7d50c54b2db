"""What one stream may hold and use: the server's limits, a request's budget under them
(`batching.budget.StreamBudget`, which does the arithmetic) and the refusals of a spec over
them."""

from __future__ import annotations

import dataclasses

import grpc

from input_client.spec import PipelineSpec
from input_server.batching.budget import BYTES_PER_TOKEN, StreamBudget
from input_server.data.roots import DataAccess
from input_server.data.tokenizers.registry import FoundModel, find_model
from input_server.errors import InputServerError, InvalidSpecError, RefusedError
from input_server.serving.coalesce import batches_per_message


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """A server's bounds on each request (see `ServerConfig` for each field's meaning)."""

    access: DataAccess
    stream_memory_mb: float
    max_workers: int


def budget_for(
    spec: PipelineSpec,
    limits: Limits,
    *,
    queue_depth: int,
    message_tokens: int,
    model: FoundModel | None = None,
) -> StreamBudget:
    """The budget of a stream of `spec` on this server: one message holds the server's
    `message_tokens`."""
    b = spec.batch
    return StreamBudget.of(
        spec,
        limit_mb=limits.stream_memory_mb,
        queue_depth=queue_depth,
        per_message=batches_per_message(b.size, b.seq_len, message_tokens),
        model=model,
    )


def admit(
    spec: PipelineSpec, limits: Limits, *, queue_depth: int, message_tokens: int
) -> tuple[StreamBudget, FoundModel | None]:
    """A request's budget and its tokenizer model, found once (its pipeline opens it from
    there; None: no model, or not found, which opening the pipeline says), before a file is
    opened; refuses a spec over the server's worker cap, or over its memory budget with the
    parallelism it asks for, its model's copies in its worker processes counted."""
    check_workers(spec, limits.max_workers)
    model = _found_model(spec, limits.access)
    budget = budget_for(
        spec, limits, queue_depth=queue_depth, message_tokens=message_tokens, model=model
    )
    check_memory(spec, budget)
    check_model_copies(spec, budget)
    return budget, model


def _found_model(spec: PipelineSpec, access: DataAccess) -> FoundModel | None:
    if not spec.tokenizer.model:
        return None
    try:
        return find_model(access, spec.tokenizer)
    except (InputServerError, OSError):  # opening the pipeline says why
        return None


def check_memory(spec: PipelineSpec, budget: StreamBudget) -> None:
    """Refuses (RESOURCE_EXHAUSTED) a stream that could hold more than the server's
    --stream-memory-mb, naming the numbers and the keys to change."""
    need = budget.held_mb(budget.asked)
    if need > budget.limit_mb:
        b = spec.batch
        raise RefusedError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the stream would hold up to {need:,.0f} MiB (batch.size {b.size} x batch.seq_len "
            f"{b.seq_len} x {BYTES_PER_TOKEN} bytes per token x {budget.queue_depth} queued "
            f"batches and more), over the server's --stream-memory-mb {budget.limit_mb:g}; "
            f"lower `batch.size` or `batch.seq_len`, or ask the operator for a larger budget.",
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


def check_model_copies(spec: PipelineSpec, budget: StreamBudget) -> None:
    """Refuses (RESOURCE_EXHAUSTED) a stream whose worker processes, each loading its own copy
    of the tokenizer model, would take it past --stream-memory-mb."""
    processes = budget.asked.processes
    need, fit = budget.with_model_copies()
    if processes <= 0 or need <= budget.limit_mb:
        return
    file_mb, copy_mb = budget.model_file_mb, budget.model_copy_mb
    raise RefusedError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"`tokenizer.model` {spec.tokenizer.model!r} ({file_mb:,.1f} MB) loads in each of the "
        f"stream's {processes} worker processes at about {copy_mb:,.0f} MB "
        f"({copy_mb / file_mb:.0f} x the file): {need:,.0f} MB with its batches, over the server's "
        f"--stream-memory-mb {budget.limit_mb:g}; ask for at most {fit} in "
        f"`workers.count` (0 tokenizes in the server, whose copy streams share), or ask the "
        f"operator for a larger budget.",
    )


def access_for(budget: StreamBudget, access: DataAccess) -> DataAccess:
    """The server's data `access` for a request, with what its `budget` leaves for its
    document order (800 M documents of one file named 40,000 times took a 3 GB server down),
    checked once its files are counted, before the order is computed."""
    order = budget.order_budget()
    if order is None:
        return access
    return dataclasses.replace(access, order_budget=order)
