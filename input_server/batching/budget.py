"""A stream's memory budget, one value made when the stream opens: what it may hold, how many
worker processes fit, what a candidate parallelism costs (the one home of that arithmetic)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from input_client.spec import PipelineSpec
from input_server.batching.parallelism import Parallelism
from input_server.data.order import OrderBudget

if TYPE_CHECKING:
    from input_server.batching.pipeline import Pipeline
    from input_server.batching.resume import Position
    from input_server.data.tokenizers.registry import FoundModel

MIB = 1 << 20
# A batch on the server at its widest: MaxText's six arrays of int32 per token (the packed
# form and the wire form are smaller; this bounds both).
BYTES_PER_TOKEN = 6 * 4
# A group of documents being read and tokenized by one thread: its text (at most
# GROUP_RAW_CHARS) and its tokens.
GROUP_MIB = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamBudget:
    """What one stream may hold, made once when it opens (`of`), its document order counted
    once the pipeline has one (`reading`). The default holds nothing to a bound and counts
    nothing (a search or a reservation with no server's budget behind it).

    Attributes:
      limit_mb: the server's --stream-memory-mb; inf = no limit.
      batch_mb: one batch at its widest (batch.size x batch.seq_len x BYTES_PER_TOKEN), MiB.
      queue_depth: batches queued ahead of the network (--queue-depth).
      per_message: batches coalesced in one message (`serving.coalesce`).
      asked: the parallelism the spec asks for as the admission counts it: a fixed count's;
        "auto"'s least (in process, one thread): its tuning keeps within the rest.
      ram_budget_mb: the spec's `workers.ram_budget_mb`.
      group_mb: a group of documents in flight (GROUP_MIB); 0 = not counted.
      model_file_mb, model_copy_mb: the tokenizer model's file and one worker process's copy
        of it loaded, MiB, as its kind reports (`ModelTokenizer.process_bytes`); 0 = not
        counted (a small model's kind, or a model not found yet: opening it says why).
      order_bytes: one process's copy of the document order the stream reads (a resharded
        state's own), which each worker process computes.
      pipeline_order_bytes: the server's copy of its pipeline's order.
    """

    limit_mb: float = math.inf
    batch_mb: float = 0.0
    queue_depth: int = 0
    per_message: int = 0
    asked: Parallelism = Parallelism(0, 1)
    ram_budget_mb: float = math.inf
    group_mb: float = 0.0
    model_file_mb: float = 0.0
    model_copy_mb: float = 0.0
    order_bytes: int = 0
    pipeline_order_bytes: int = 0

    @classmethod
    def of(
        cls,
        spec: PipelineSpec,
        *,
        limit_mb: float,
        queue_depth: int,
        per_message: int,
        model: FoundModel | None = None,
    ) -> StreamBudget:
        """The budget of a stream of `spec` under the server's `limit_mb`, its `queue_depth`
        and `per_message` batches a message, with its tokenizer's `model` (None: none found)."""
        b, w = spec.batch, spec.workers
        return cls(
            limit_mb=limit_mb,
            batch_mb=b.size * b.seq_len * BYTES_PER_TOKEN / MIB,
            queue_depth=queue_depth,
            per_message=per_message,
            asked=Parallelism(0, 1) if w.count == "auto" else Parallelism.fixed(w.count, w.threads),
            ram_budget_mb=w.ram_budget_mb,
            group_mb=GROUP_MIB,
            model_file_mb=model.file_bytes / MIB if model else 0.0,
            model_copy_mb=model.process_bytes / MIB if model else 0.0,
        )

    def reading(self, pipeline: Pipeline, position: Position | None = None) -> StreamBudget:
        """This budget with the document order of `pipeline` read from `position` counted."""
        return dataclasses.replace(
            self,
            order_bytes=order_bytes(pipeline, position),
            pipeline_order_bytes=order_bytes(pipeline),
        )

    # --- what the stream holds ------------------------------------------------------------

    def held_mb(self, parallelism: Parallelism | None = None) -> float:
        """The most the stream holds, MiB: its queued batches, one message's coalesced ones,
        the one being packed and the one being sent, and the groups of documents in flight at
        `parallelism` (None: the batches alone)."""
        groups = parallelism.workers if parallelism is not None else 0
        return (self.queue_depth + self.per_message + 2) * self.batch_mb + groups * self.group_mb

    def with_model_copies(self) -> tuple[float, int]:
        """What the stream holds as it asks, each of its worker processes' copy of the model
        counted, MiB; and how many such copies fit beside its batches and groups."""
        used = self.held_mb(self.asked)
        need = used + self.asked.processes * self.model_copy_mb
        if self.model_copy_mb <= 0:
            return need, self.asked.processes
        return need, max(0, int((self.limit_mb - used) // self.model_copy_mb))

    def order_budget(self) -> OrderBudget | None:
        """What the batches and groups leave for the document order: one copy in the server's
        process and one in each worker process asked for ("auto"'s are held to the copies that
        fit, `processes_fit`). None: no limit."""
        if self.limit_mb == math.inf:
            return None
        used = self.held_mb(self.asked)
        return OrderBudget(
            max_bytes=int((self.limit_mb - used) * MIB),
            copies=1 + self.asked.processes,
            flag_mb=self.limit_mb,
        )

    # --- what fits ------------------------------------------------------------------------

    def groups_mb(self) -> float:
        """What the groups in flight (and worker processes, measured) may use: the spec's
        `ram_budget_mb`, within what the batches and the server's copy of the pipeline's order
        leave of the limit."""
        left = self.limit_mb - self.pipeline_order_bytes / MIB - self.held_mb()
        return min(self.ram_budget_mb, left)

    def processes_fit(self) -> int | None:
        """The worker processes whose copies of the order fit in `groups_mb`; None when the
        order holds nothing (or nothing bounds them)."""
        left = self.groups_mb()
        if self.order_bytes <= 0 or left == math.inf:
            return None
        return max(0, int(left * MIB // self.order_bytes))

    def threads_fit(self) -> int | None:
        """The threads whose groups fit in `groups_mb` (at least 1); None: nothing bounds them."""
        left = self.groups_mb()
        if self.group_mb <= 0 or left == math.inf:
            return None
        return max(1, int(left / self.group_mb))

    # --- what a candidate costs -----------------------------------------------------------

    def window_mb(self, parallelism: Parallelism, added_mb: float) -> float:
        """A measured window's memory as a search's caps count it: what `parallelism`'s worker
        processes added (measured, `measure.added_bytes`) and its groups in flight."""
        return added_mb + parallelism.workers * self.group_mb

    def candidate_mb(
        self, candidate: Parallelism, measured: tuple[Parallelism, float] | None = None
    ) -> float:
        """What `candidate` would hold: its groups in flight and, for worker processes, each at
        the memory a process measured: `measured` is a process candidate's parallelism and its
        `window_mb` (None: none measured yet)."""
        process_mb = 0.0
        if measured is not None and not candidate.in_process:
            p, mb = measured
            process_mb = (mb - p.workers * self.group_mb) / p.processes * candidate.processes
        return candidate.workers * self.group_mb + process_mb


# No bound, nothing counted: a search or a reservation with no server's budget behind it.
UNBOUNDED = StreamBudget()


def order_bytes(pipeline: Pipeline, position: Position | None = None) -> int:
    """What one process's copy of a pipeline's document order holds at most; from `position`
    on, whose order may be a resharded state's (the old hosts' permutations too)."""
    order = pipeline.order if position is None or position.order is None else position.order
    return order.held_bytes()
