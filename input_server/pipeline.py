"""Pipeline assembly: ordered documents -> tokenized groups (Grain, parallel) -> packed batches.

Grain warns that packing before its multiprocess prefetch makes the output depend on the worker
count, so only the per-document work (read + tokenize, in order-preserving groups) runs in
parallel, and packing runs after it, in order, in the consuming process. The resume state is
the stream position `(doc, offset)` after a batch, which no worker count changes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from typing import Any

import grain
import numpy as np

from input_client.codec import decode_state
from input_client.spec import PipelineSpec, SpecError, validate
from input_server.errors import InvalidSpecError
from input_server.pack import DocCursor, pack_batch
from input_server.sources import DocumentSource
from input_server.tokenize import TokenGroup, Tokenizer

# Documents per sentencepiece call: big enough that the batch call amortizes Python overhead,
# small enough that a resume re-tokenizes little (DESIGN.md measured groups of 64).
GROUP_SIZE = 64
STATE_VERSION = 1
cpu_count = os.cpu_count


def _ensure_absl_flags_parsed() -> None:
    # Grain reads absl flags; entry points that do not use absl must mark them parsed.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a stream stands: the next batch's sequence number and the next unused token."""

    seq: int = 0
    doc: int = 0
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class Workers:
    """The parallelism a stream runs with; `reason` says how it was chosen."""

    processes: int
    threads: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Produced:
    """One packed batch with its sequence number and the resume state after it."""

    seq: int
    arrays: dict[str, np.ndarray]
    state: dict[str, Any]
    num_tokens: int


class _EncodeGroup:
    """Reads and tokenizes documents `[g * size, (g + 1) * size)` of the ordered stream."""

    def __init__(self, docs: grain.MapDataset, size: int, tokenizer: Tokenizer):
        self.docs = docs
        self.size = size
        self.tokenizer = tokenizer

    def __call__(self, g: int) -> TokenGroup:
        first = g * self.size
        last = min(first + self.size, len(self.docs))
        texts = [self.docs[i] for i in range(first, last)]
        return self.tokenizer.encode(texts, first_doc=first)


def default_threads(processes: int) -> int:
    """Tokenizer threads per process: sentencepiece releases the GIL, so threads fill cores."""
    return max(1, min(8, (cpu_count() or 1) // max(1, processes)))


class Pipeline:
    """A validated spec with its files and tokenizer opened; makes batch streams from any state.

    Raises (from the constructor):
      InvalidSpecError: a key's value cannot work (the message names key and value).
      DataNotFoundError: a file, glob or model is missing.
    """

    def __init__(self, spec: PipelineSpec):
        try:
            validate(spec)
        except SpecError as e:
            raise InvalidSpecError(str(e)) from e
        self.spec = spec
        self.fingerprint = spec.data_fingerprint()
        self.tokenizer = Tokenizer(spec.tokenizer)
        self.source = DocumentSource.from_spec(spec.source)
        shard, order = spec.shard, spec.order
        docs = grain.MapDataset.source(self.source)[shard.index::shard.count]
        if len(docs) == 0:
            raise InvalidSpecError(
                f"`shard.index` {shard.index} of `shard.count` {shard.count} holds no documents "
                f"({len(self.source)} in all); use fewer shards.")
        self.docs_per_epoch = len(docs)
        if order.shuffle:
            docs = docs.shuffle(seed=order.seed)
        self._docs = docs.repeat(order.epochs if order.epochs else None)

    def parse_state(self, state: bytes | dict[str, Any] | None) -> Position:
        """Reads a resume state sent back by a client; refuses one made for other data."""
        if not state:
            return Position()
        try:
            d = decode_state(state) if isinstance(state, bytes) else dict(state)
            version, fp = d["version"], d["fingerprint"]
            pos = Position(seq=int(d["seq"]), doc=int(d["doc"]), offset=int(d["offset"]))
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidSpecError(
                f"`resume_state` is not a state this server wrote: {e!r}.") from e
        if version != STATE_VERSION:
            raise InvalidSpecError(f"`resume_state` has version {version!r}; this server reads "
                                   f"version {STATE_VERSION}.")
        if fp != self.fingerprint:
            raise InvalidSpecError(
                f"`resume_state` was made for other data (fingerprint {fp!r}, this spec's is "
                f"{self.fingerprint!r}): resume with the spec that produced it.")
        if min(pos.seq, pos.doc, pos.offset) < 0 or pos.doc > len(self._docs):
            raise InvalidSpecError(f"`resume_state` position {dataclasses.asdict(pos)} is out of "
                                   f"range.")
        return pos

    def state_of(self, pos: Position) -> dict[str, Any]:
        return {"version": STATE_VERSION, "fingerprint": self.fingerprint, "seq": pos.seq,
                "doc": pos.doc, "offset": pos.offset}

    def groups(self, first_doc: int = 0) -> grain.MapDataset:
        """Tokenized document groups from the one holding `first_doc` on."""
        num_groups = math.ceil(len(self._docs) / GROUP_SIZE)
        encode = _EncodeGroup(self._docs, GROUP_SIZE, self.tokenizer)
        return grain.MapDataset.range(first_doc // GROUP_SIZE, num_groups).map(encode)

    def _parallel(self, groups: grain.MapDataset, workers: Workers) -> grain.IterDataset:
        ds = groups.to_iter_dataset(grain.ReadOptions(
            num_threads=workers.threads, prefetch_buffer_size=2 * workers.threads))
        if workers.processes > 0:
            _ensure_absl_flags_parsed()
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers.processes))
        return ds

    def resolve_workers(self) -> Workers:
        """The spec's worker count, or for "auto" Grain's `pick_performance_config`."""
        count = self.spec.workers.count
        if count != "auto":
            return Workers(count, default_threads(count), "fixed by workers.count")
        from grain.experimental import pick_performance_config

        probe = self.groups().to_iter_dataset()
        config = pick_performance_config(probe, ram_budget_mb=self.spec.workers.ram_budget_mb,
                                         max_workers=None, max_buffer_size=None)
        processes = config.multiprocessing_options.num_workers
        return Workers(processes, default_threads(processes),
                       "auto: Grain pick_performance_config (RAM budget / element size, "
                       "capped at the CPU count)")

    def stream(self, state: bytes | dict[str, Any] | None = None, *,
               workers: Workers | None = None) -> BatchStream:
        """Batches from the start, or right after the batch whose state is given."""
        pos = self.parse_state(state)
        workers = workers or self.resolve_workers()
        return BatchStream(self, pos, workers)


class BatchStream:
    """An iterator of `Produced` batches; `close()` stops the Grain workers."""

    def __init__(self, pipeline: Pipeline, pos: Position, workers: Workers):
        self.pipeline = pipeline
        self.workers = workers
        self._seq = pos.seq
        self._it = iter(pipeline._parallel(pipeline.groups(pos.doc), workers))
        self._cursor = DocCursor(self._it, pos.doc, pos.offset)
        self._closed = False

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch will carry."""
        return self._seq

    def __iter__(self) -> Iterator[Produced]:
        return self

    def __next__(self) -> Produced:
        if self._closed:
            raise StopIteration
        b = self.pipeline.spec.batch
        arrays = pack_batch(self._cursor, size=b.size, seq_len=b.seq_len, packing=b.packing)
        if arrays is None:
            self.close()
            raise StopIteration
        seq = self._seq
        self._seq += 1
        state = self.pipeline.state_of(Position(self._seq, self._cursor.doc, self._cursor.offset))
        num_tokens = int(np.count_nonzero(arrays["inputs_segmentation"]))
        return Produced(seq=seq, arrays=arrays, state=state, num_tokens=num_tokens)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            close = getattr(self._it, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
