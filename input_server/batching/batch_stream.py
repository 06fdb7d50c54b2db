"""The batch stream: packed batches from a position, its parallelism switched between batches.

Grain warns that packing before its multiprocess prefetch makes the output depend on the worker
count, so only the per-document work (read + tokenize, in order-preserving groups:
`Pipeline.groups`) runs in parallel, and packing runs here, after it, in order, in the
consuming process.

The batches are the same bytes for any processes x threads, and a group of documents is the
same whichever stage computes it. So a switch opens the new parallel stage beside the running
one, at a group the running one will reach about when the new one has started its threads or
worker processes (`handover.py`); the packer reads the running stage's groups up to there,
then the new stage's, and the old stage closes on a thread of its own. Nothing is lost or
repeated, and the stream does not stop while worker processes spawn (before, a switch opened
the new stage at the next batch and waited for it: ~2 s without a batch for 2 processes).
The switch is asked for from any thread and begun by the consuming thread before its next
batch; the asker waits on what `switch` returns, which ends at the handover. The server runs
every stream as one of these: a fixed count's is one that is never asked to switch.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
import typing
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from input_client.spec import PipelineSpec
from input_server.batching.encode import BUSY_KEY, STAGES_KEY, EncodeGroup
from input_server.batching.grain_adapter import parallel
from input_server.batching.handover import Feed
from input_server.batching.meter import LiveMeter
from input_server.batching.pack import DocCursor, Produced, pack_batch
from input_server.batching.parallelism import Parallelism
from input_server.batching.resume import Position
from input_server.data.elastic import heads_of
from input_server.data.order import Order
from input_server.data.tokenizers import TokenGroup, Tokenizer

if TYPE_CHECKING:  # imported where groups are made: the server listens before Grain loads
    import grain

# How long a closed stream waits for the groups its threads began before closing its files
# (a group of slow, remote records may take seconds; past this they close regardless).
CLOSE_WAIT_S = 5.0
log = logging.getLogger(__name__)


class StreamPipeline(typing.Protocol):
    """What a stream asks of the pipeline it runs on: `pipeline.Pipeline`, which makes the
    streams (`Pipeline.stream`), so this module names it by what it offers, not by import."""

    spec: PipelineSpec
    tokenizer: Tokenizer
    group_size: int  # documents per group

    def encoder(self, order: Order | None = None) -> EncodeGroup: ...

    def order_at(self, pos: Position) -> Order: ...

    def groups(self, first_doc: int = 0, encode: EncodeGroup | None = None) -> grain.MapDataset: ...

    def state_of(self, pos: Position) -> dict[str, Any]: ...

    def stream_opened(self) -> None: ...

    def stream_closed(self) -> None: ...


class PendingSwitch:
    """A switch asked for: `wait()` returns once the consuming thread made it, could not (the
    new stage would not open, a later switch replaced it, it was withdrawn) or the stream
    closed; `made` says which."""

    def __init__(self, to: Parallelism):
        self.to = to
        self.made = False
        self._done = threading.Event()

    def end(self, made: bool) -> None:
        """The stream's, once: the switch was made or not; its waiter returns."""
        self.made = made
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the switch has ended, made or not, within `timeout`."""
        return self._done.wait(timeout)


@typing.runtime_checkable
class ServedStream(typing.Protocol):
    """What the server asks of every stream it serves (`serving/session.py`'s producer,
    `serving/retune.py`'s live tuner): one type for all, so nothing asks a stream what it has.
    `BatchStream` is the one implementation; a fixed count's stream is never switched."""

    pipeline: StreamPipeline
    meter: LiveMeter  # the producer's waits: a live tuner reads the loop's pace from it
    switches: int  # stages opened after the first (the watchdog's generations)

    @property
    def parallelism(self) -> Parallelism: ...

    @property
    def next_seq(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def switch(self, parallelism: Parallelism) -> PendingSwitch: ...

    def withdraw(self, asked: PendingSwitch) -> None: ...

    def __iter__(self) -> Iterator[Produced]: ...

    def __next__(self) -> Produced: ...

    def worker_processes(self) -> list[tuple[int, BaseProcess]]: ...

    def close(self) -> None: ...


class Packer:
    """Batches from one position: the `Feed` of tokenized groups it opens at a parallelism
    (handed over to another stage by `hand_over`) and the cursor that packs them. A switch
    that cannot be handed over closes it and opens the next one where the next batch starts.
    """

    def __init__(
        self, pipeline: StreamPipeline, pos: Position, parallelism: Parallelism, meter: LiveMeter
    ):
        self.pipeline = pipeline
        self._seq = pos.seq
        self._encode = pipeline.encoder(pipeline.order_at(pos))
        order = self._encode.order
        self._mix = order.at  # its interleave (None: one source)
        self._elastic, self._base = pos.elastic, pos.order  # a resharded stream's layout
        size = pipeline.group_size
        self._feed = Feed(self._stage(parallelism, pos.doc), parallelism, pos.doc // size, size)
        b = pipeline.spec.batch
        self._meter = meter
        self._waited_s = 0.0  # the packer waiting for groups (`_groups`)
        self._cursor = DocCursor(
            self._groups(),
            pos.doc,
            pos.offset,
            long_documents=b.long_documents_policy,
            seq_len=b.seq_len,
            heads=heads_of(order),
        )
        self._closed = False
        self._stale = False  # worker processes may run a backend an audit found wrong
        pipeline.stream_opened()

    def _stage(self, parallelism: Parallelism, first_doc: int) -> grain.DatasetIterator:
        """The groups from the one holding `first_doc` on, computed at `parallelism`."""
        groups = self.pipeline.groups(first_doc, self._encode)
        return iter(parallel(groups, processes=parallelism.processes, threads=parallelism.threads))

    def _groups(self) -> Iterator[TokenGroup]:
        feed, meter = self._feed, self._meter
        while True:
            waited = time.perf_counter()
            try:
                element = next(feed)
            except StopIteration:
                return
            waited = time.perf_counter() - waited
            self._waited_s += waited
            meter.group(float(element[BUSY_KEY]), waited, element[STAGES_KEY])
            group = TokenGroup.from_element(element)
            meter.audit(group)
            if group.mismatched:
                self._mismatched(group)
            yield group

    def _mismatched(self, group: TokenGroup) -> None:
        """An audit's mismatch (its worker fell back itself) moves this process's tokenizer to
        the reference, for later streams too, and marks the packer stale: its other worker
        processes may run the backend."""
        self._stale = self.parallelism.processes > 0
        if self.pipeline.tokenizer.choice.backend != "reference":
            why = f"an audit found the backend's ids differ in documents {group.first_doc}+"
            self.pipeline.tokenizer.fall_back(why)

    def take_stale(self) -> bool:
        """Whether an audit found the backend wrong where worker processes run, since last
        asked: its stage should be made anew (`BatchStream` does it once, then asks again)."""
        stale, self._stale = self._stale, False
        return stale

    @property
    def parallelism(self) -> Parallelism:
        """The running stage's (a handover's new one from the group it starts at)."""
        return self._feed.parallelism

    @property
    def handing_over(self) -> bool:
        return self._feed.handing_over

    @property
    def last_ready_s(self) -> float:
        """The latest handover's new stage: seconds from opening to its first group."""
        return self._feed.last_ready_s

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch will carry."""
        return self._seq

    @property
    def closed(self) -> bool:
        """Whether the stream has ended or was closed."""
        return self._closed

    def position(self) -> Position:
        """Where the next batch starts: a stream opened here yields the same batches."""
        return Position(self._seq, *self._cursor.at(), self._mix, self._elastic, self._base)

    def hand_over(self, to: Parallelism, done: Callable[[bool], None]) -> bool:
        """Opens a stage at `to` beside the running one (`Feed.hand_over`; `done(made)` says
        how it ended); False if too few groups are left for one (nothing opened)."""
        size = self.pipeline.group_size
        end = math.ceil(len(self._encode.order) / size)
        return self._feed.hand_over(to, lambda group: self._stage(to, group * size), done, end=end)

    def __iter__(self) -> Iterator[Produced]:
        return self

    def __next__(self) -> Produced:
        if self._closed:
            raise StopIteration
        b = self.pipeline.spec.batch
        started, waited = time.perf_counter(), self._waited_s
        batch = pack_batch(self._cursor, size=b.size, seq_len=b.seq_len, packing=b.packing)
        # Packing is what the packer did not spend waiting.
        self._meter.add("pack", time.perf_counter() - started - (self._waited_s - waited))
        if batch is None:
            self.close()
            raise StopIteration
        seq = self._seq
        self._seq += 1
        state = self.pipeline.state_of(self.position())
        return Produced(seq=seq, batch=batch, state=state)

    def worker_processes(self) -> list[tuple[int, BaseProcess]]:
        """(worker index, process) of each Grain worker process it runs now; may raise
        RuntimeError, then call again."""
        return self._feed.worker_processes()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            in_process = self.parallelism.in_process
            # The groups the cursor and Grain's buffers hold are backed by shared memory, which
            # Grain unlinks when the last array of each goes: now, not when this object does
            # (maybe never, or too late at interpreter exit, where resource_tracker reports
            # them as leaked). The feed lets go of its stages' groups as it closes them.
            self._feed.close()
            self._cursor = None
            # The files' descriptors and maps, at once: a cancelled stream of 500 files held
            # 1,009 of 1,024 descriptors until a collection found Grain's cycles. In process,
            # after the groups Grain's threads are finishing (a group: ~0.1 s).
            if not self._encode.in_flight.stop(CLOSE_WAIT_S):
                log.warning("a closed stream's groups still run after %.0f s", CLOSE_WAIT_S)
            self.pipeline.stream_closed()
            if not in_process:
                # Grain's iterators hold each other in reference cycles, which only the cycle
                # collector frees; a stream with worker processes closes seldom, so collect
                # now. In process, no shared memory is at stake.
                gc.collect()


class BatchStream:
    """An iterator of `Produced` batches from a position, at a parallelism `switch` changes
    from the next batch taken on; `close()` stops its stages' threads and worker processes.

    Every stream has a meter (`meter`: a live-tuned one's tuner reads it) and counts the stages
    it opened after its first (`switches`: the watchdog's generations) and those it was asked
    for that would not open (`failed_switches`).
    """

    def __init__(
        self,
        pipeline: StreamPipeline,
        position: Position,
        parallelism: Parallelism,
        *,
        meter: LiveMeter | None = None,
    ):
        self._pipeline = pipeline
        self._meter = meter if meter is not None else LiveMeter()
        self._packer = Packer(pipeline, position, parallelism, self._meter)
        self._pending: PendingSwitch | None = None
        self._lock = threading.Lock()
        self._switches = 0  # stages opened after the first (the watchdog's generations)
        self._failed_switches = 0  # asked for, but the new stage would not open

    @property
    def pipeline(self) -> StreamPipeline:
        return self._pipeline

    @property
    def meter(self) -> LiveMeter:
        return self._meter

    @property
    def switches(self) -> int:
        return self._switches

    @property
    def failed_switches(self) -> int:
        return self._failed_switches

    @property
    def parallelism(self) -> Parallelism:
        return self._packer.parallelism

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch will carry."""
        return self._packer.next_seq

    @property
    def closed(self) -> bool:
        """Whether the stream has ended or was closed: it switches no more."""
        return self._packer.closed

    @property
    def handover_ready_s(self) -> float:
        """The latest handover's new stage (since the last stage opened where a batch starts):
        seconds from opening to its first group."""
        return self._packer.last_ready_s

    def position(self) -> Position:
        """Where the next batch starts: a stream opened here yields the same batches."""
        return self._packer.position()

    def switch(self, parallelism: Parallelism) -> PendingSwitch:
        """Runs the stream with `parallelism` from the next batch taken on (the last asked
        wins); wait on the returned `PendingSwitch` for it to be made."""
        asked = PendingSwitch(parallelism)
        with self._lock:
            replaced, self._pending = self._pending, asked
        if replaced is not None:
            replaced.end(False)
        if self.closed:
            self.withdraw(asked)
        return asked

    def withdraw(self, asked: PendingSwitch) -> None:
        """Takes back `asked` unless the consuming thread is already making it (then wait for
        it): the one who asked stops waiting for a stream that may never take another batch."""
        with self._lock:
            if self._pending is not asked:
                return
            self._pending = None
        asked.end(False)

    def __iter__(self) -> Iterator[Produced]:
        return self

    def __next__(self) -> Produced:
        with self._lock:  # a switch asked while one is being made waits for its handover
            asked = None
            if not self._packer.handing_over:
                asked, self._pending = self._pending, None
        if self._packer.take_stale():  # an audit found the backend wrong: the reference now
            # once: a stage that will not open goes on as it was
            self._switch(self._packer.parallelism, again=True)
        if asked is not None:
            self._hand_over(asked)
        return next(self._packer)

    def _hand_over(self, asked: PendingSwitch) -> None:
        """Opens `asked.to` beside the running stage; `asked` ends at the handover."""
        packer, wanted = self._packer, asked.to
        if packer.closed or wanted == packer.parallelism:
            asked.end(False)
            return

        def done(made: bool) -> None:  # the packer's parallelism is `wanted` if made
            if made:
                self._switches += 1
            elif not packer.closed:
                self._failed_switches += 1
            asked.end(made)

        if not packer.hand_over(wanted, done):
            # Too few groups left for a handover (a short stream's groups are few and long):
            # the new stage opens where the next batch starts.
            made = False
            try:
                made = self._switch(wanted)
            finally:
                asked.end(made)

    def _switch(self, wanted: Parallelism, again: bool = False) -> bool:
        """Opens the stage at `wanted` where the next batch starts and closes the old one
        (`again`: even at the same parallelism, its worker processes made anew); whether it
        did."""
        current = self._packer.parallelism
        if not self._packer.closed and (again or wanted != current):
            old = self._packer
            try:
                new = Packer(self._pipeline, old.position(), wanted, self._meter)
            except Exception:  # noqa: BLE001 - the stream goes on as it was
                log.warning(
                    "switching to %d processes x %d threads failed; the stream goes on at %d x %d",
                    wanted.processes,
                    wanted.threads,
                    current.processes,
                    current.threads,
                    exc_info=True,
                )
                self._failed_switches += 1
                return False
            self._packer = new
            # Counted before the old stage stops: its workers' exits are not deaths.
            self._switches += 1
            try:
                old.close()
            except Exception:  # noqa: BLE001 - e.g. Grain's teardown tripping over its pipe
                log.warning("closing the stage switched from failed", exc_info=True)
            return True  # and the old stage's worker processes are gone
        return False

    def worker_processes(self) -> list[tuple[int, BaseProcess]]:
        """(worker index, process) of each Grain worker process this stream runs now
        (`grain_adapter.worker_processes`); may raise RuntimeError, then call again."""
        return self._packer.worker_processes()

    def close(self) -> None:
        try:
            self._packer.close()
        finally:  # even a failing close ends the switch waited on: its asker must not hang
            with self._lock:
                asked, self._pending = self._pending, None
            if asked is not None:
                asked.end(False)

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
