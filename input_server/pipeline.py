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
from multiprocessing.process import BaseProcess
from typing import Any

import grain
import numpy as np

from input_client.codec import decode_state
from input_client.spec import PipelineSpec, SpecError, validate
from input_server.errors import InvalidSpecError
from input_server.order import DocumentOrder
from input_server.pack import DocCursor, PackedBatch, pack_batch
from input_server.sources import DocumentSource
from input_server.tokenize import TokenGroup, Tokenizer

# Text to tokenize per group (after long documents are cut, see tokenize.CUT_MARGIN_*): bigger
# calls amortize each group's fixed costs; groups of this size (1713 short documents, 119 long
# ones) ran 1.35x and 1.09x as fast as groups of 64 (scripts/bench_tokenize.py). But a group's
# records are read one after another, so from slow (remote) storage a bigger group is a longer
# wait for each thread, and the autotuner's windows stretch past its time bound: 256 KiB. The
# documents per group follow from a sample of the corpus; the data never depends on it.
GROUP_CHARS = 256 << 10
GROUP_RAW_CHARS = 4 << 20
MIN_GROUP, MAX_GROUP = 8, 4096
SAMPLE_DOCS = 64
STATE_VERSION = 1
cpu_count = os.cpu_count


def ensure_absl_flags_parsed() -> None:
    # Grain reads absl flags; entry points that do not use absl must mark them parsed.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _die_with_parent(worker_index: int, worker_count: int) -> None:
    """Runs in each Grain worker process: ask Linux to kill it when the server dies, so a
    SIGKILLed server leaves no orphaned workers (Grain stops them only on a clean close)."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a stream stands: the next batch's sequence number and the next unused token."""

    seq: int = 0
    doc: int = 0
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class Workers:
    """The parallelism a stream runs with; `reason` says how it was chosen.

    `tuning` is the autotuner's `autotune.Tuning` (its measurements and choice) for "auto",
    else None.
    """

    processes: int
    threads: int
    reason: str
    tuning: Any = None


@dataclasses.dataclass(frozen=True)
class Produced:
    """One packed batch with its sequence number and the resume state after it."""

    seq: int
    batch: PackedBatch
    state: dict[str, Any]

    @property
    def num_tokens(self) -> int:
        return self.batch.num_tokens

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """MaxText's six arrays (derived from the compact batch on each access)."""
        return self.batch.arrays()


class _EncodeGroup:
    """Reads and tokenizes documents `[g * size, (g + 1) * size)` of the ordered stream."""

    def __init__(self, order: DocumentOrder, source: DocumentSource, size: int,
                 tokenizer: Tokenizer, *, trim_to: int | None = None):
        self.order = order
        self.source = source
        self.size = size
        self.tokenizer = tokenizer
        # Packings that keep only a document's first seq_len tokens need no more from it.
        self.trim_to = trim_to

    def __call__(self, g: int) -> dict[str, np.ndarray]:
        first = g * self.size
        indices = self.order.source_indices(first, first + self.size).tolist()
        read_many = getattr(self.source, "read_many", None)
        texts = read_many(indices) if read_many else [self.source[i] for i in indices]
        # One sentencepiece thread: the call releases the GIL, so Grain's threads (and
        # processes) are the tokenizing parallelism, which the autotuner sizes (2 threads x 1
        # ran 0.93-1.06x as fast as 2 x 2, scripts/bench_tokenize.py).
        return self.tokenizer.encode(texts, first_doc=first, num_threads=1,
                                     trim_to=self.trim_to).to_element()


def default_threads(processes: int) -> int:
    """Grain threads per process, each reading and tokenizing a group: one per core, since
    sentencepiece's `encode` releases the GIL; more only pay off to overlap slow reads,
    which the autotuner finds by measuring."""
    return max(1, min(8, (cpu_count() or 1) // max(1, processes)))


class Pipeline:
    """A validated spec with its files and tokenizer opened; makes batch streams from any state.

    Raises (from the constructor):
      InvalidSpecError: a key's value cannot work (the message names key and value).
      DataNotFoundError: a file, glob or model is missing.
    """

    def __init__(self, spec: PipelineSpec, *, source: DocumentSource | None = None):
        # `source` replaces the spec's files with another random-access source of strings,
        # e.g. tests' stand-in for slow remote storage; it must pickle for worker processes.
        try:
            validate(spec)
        except SpecError as e:
            raise InvalidSpecError(str(e)) from e
        self.spec = spec
        self.fingerprint = spec.data_fingerprint()
        self.tokenizer = Tokenizer(spec.tokenizer)
        self.substitute_source = source is not None
        self.source = source if source is not None else DocumentSource.from_spec(spec.source)
        shard, order = spec.shard, spec.order
        self.order = DocumentOrder(num_records=len(self.source), shard_index=shard.index,
                                   shard_count=shard.count, seed=order.seed,
                                   shuffle=order.shuffle, epochs=order.epochs)
        if self.order.per_epoch == 0:
            raise InvalidSpecError(
                f"`shard.index` {shard.index} of `shard.count` {shard.count} holds no documents "
                f"({len(self.source)} in all); use fewer shards.")
        self.docs_per_epoch = self.order.per_epoch
        self.group_size = self._group_size()

    def _trim_to(self) -> int | None:
        """Tokens the packer keeps of a document, if it keeps only a document's first ones."""
        b = self.spec.batch
        return None if b.packing == "concat_then_split" else b.seq_len

    def _group_size(self) -> int:
        """Documents per group, so that a group is about GROUP_CHARS of text to tokenize,
        from a sample of the data (which also teaches the tokenizer its characters per token,
        used for cutting long documents before tokenizing)."""
        sample = [self.source[i] for i in range(min(SAMPLE_DOCS, len(self.source)))]
        self.tokenizer.learn_chars_per_token(sample)
        trim_to = self._trim_to()
        chars = [self.tokenizer.tokenized_chars(len(t), trim_to) for t in sample]
        mean_chars = max(1, sum(chars) // max(1, len(chars)))
        # Cutting makes long documents cheap to tokenize, not to read or hold: the whole text
        # of a group stays bounded too (with a short seq_len a group of long documents would
        # otherwise grow to MAX_GROUP of them).
        mean_raw = max(1, sum(map(len, sample)) // max(1, len(sample)))
        size = min(GROUP_CHARS // mean_chars, GROUP_RAW_CHARS // mean_raw)
        return min(MAX_GROUP, max(MIN_GROUP, size))

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
        if min(pos.seq, pos.doc, pos.offset) < 0 or pos.doc > len(self.order):
            raise InvalidSpecError(f"`resume_state` position {dataclasses.asdict(pos)} is out of "
                                   f"range.")
        return pos

    def state_of(self, pos: Position) -> dict[str, Any]:
        return {"version": STATE_VERSION, "fingerprint": self.fingerprint, "seq": pos.seq,
                "doc": pos.doc, "offset": pos.offset}

    def groups(self, first_doc: int = 0) -> grain.MapDataset:
        """Tokenized document groups from the one holding `first_doc` on."""
        size = self.group_size
        encode = _EncodeGroup(self.order, self.source, size, self.tokenizer,
                              trim_to=self._trim_to())
        return grain.MapDataset.range(first_doc // size, math.ceil(len(self.order) / size)).map(
            encode)

    def _parallel(self, groups: grain.MapDataset, workers: Workers) -> grain.IterDataset:
        ds = groups.to_iter_dataset(grain.ReadOptions(
            num_threads=workers.threads, prefetch_buffer_size=2 * workers.threads))
        if workers.processes > 0:
            ensure_absl_flags_parsed()
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers.processes),
                                worker_init_fn=_die_with_parent)
        return ds

    def resolve_workers(self) -> Workers:
        """The spec's worker count, or for "auto" the autotuner's measured choice.

        "auto" runs this pipeline at candidate processes x threads (`autotune.tune`) once per
        spec in the server process (its first stream tunes; later streams reuse the choice).
        """
        count = self.spec.workers.count
        if count != "auto":
            return Workers(count, default_threads(count), "fixed by workers.count")
        from input_server import autotune

        return autotune.auto_workers(self)

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
        groups = (TokenGroup.from_element(e) for e in self._it)
        self._cursor = DocCursor(groups, pos.doc, pos.offset)
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
        batch = pack_batch(self._cursor, size=b.size, seq_len=b.seq_len, packing=b.packing)
        if batch is None:
            self.close()
            raise StopIteration
        seq = self._seq
        self._seq += 1
        state = self.pipeline.state_of(Position(self._seq, self._cursor.doc, self._cursor.offset))
        return Produced(seq=seq, batch=batch, state=state)

    def worker_processes(self) -> list[tuple[int, BaseProcess]]:
        """(worker index, process) of each Grain worker process this stream runs now.

        Grain keeps them inside its iterators (one `ProcessPrefetchDatasetIterator` per worker,
        at the worker's index in the interleave's lists) and lists them nowhere public, so this
        walks the iterator graph (checked against grain 0.2.18). A worker whose iterator the
        interleave has not taken up yet is not found; it is found once the stream waits on it,
        which is when its death matters. May raise RuntimeError if the graph changes under the
        walk; call again.
        """
        found, seen = [], set()
        todo = [(self._it, 0)]
        while todo:
            node, slot = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            for name, value in list(vars(node).items()):
                if name == "_prefetch_process" and isinstance(value, BaseProcess):
                    found.append((slot, value))
                children = [(value, slot)]
                if isinstance(value, list):
                    children = [(v, i) for i, v in enumerate(value)]
                for child, child_slot in children:
                    for c in child if isinstance(child, tuple) else (child,):
                        if isinstance(c, grain.DatasetIterator):
                            todo.append((c, child_slot))
        return found

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
