"""A batch stream whose parallelism may change between two batches, the data unchanged.

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

import logging
import math
import threading
import typing
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

from input_server.batching._grain import parallel
from input_server.batching.handover import Feed
from input_server.batching.meter import LiveMeter
from input_server.batching.pack import Produced
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import BatchStream, Pipeline
from input_server.batching.resume import Position

log = logging.getLogger(__name__)


class PendingSwitch:
    """A switch asked for: `wait()` returns once the consuming thread made it, could not (the
    new stage would not open, a later switch replaced it, it was withdrawn) or the stream
    closed; `made` says which."""

    def __init__(self, to: Parallelism):
        self.to = to
        self.made = False
        self._done = threading.Event()

    def _end(self, made: bool) -> None:
        self.made = made
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the switch has ended, made or not, within `timeout`."""
        return self._done.wait(timeout)


@typing.runtime_checkable
class ServedStream(typing.Protocol):
    """What the server asks of every stream it serves (`serving/session.py`'s producer,
    `serving/retune.py`'s live tuner): one type for all, so nothing asks a stream what it has.
    `SwitchingStream` is the one implementation; a fixed count's stream is never switched."""

    pipeline: Pipeline
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


class SwitchingStream:
    """`BatchStream`'s interface, with `switch(parallelism)` taking effect at the next batch.

    Every stream has a meter (`meter`: a live-tuned one's tuner reads it) and counts the stages
    it opened after its first (`switches`: the watchdog's generations).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        position: Position,
        parallelism: Parallelism,
        *,
        meter: LiveMeter | None = None,
    ):
        self.pipeline = pipeline
        self.meter = meter if meter is not None else LiveMeter()
        self._stream = self._open(position, parallelism)
        self._pending: PendingSwitch | None = None
        self._lock = threading.Lock()
        self.switches = 0  # stages opened after the first (the watchdog's generations)
        self.failed_switches = 0  # asked for, but the new stage would not open

    def _open(self, position: Position, parallelism: Parallelism) -> BatchStream:
        stream = self.pipeline.stream(position, parallelism=parallelism, meter=self.meter)
        # Its packer reads a Feed (before its first batch), so that a later switch can open
        # the next stage beside this one.
        size = self.pipeline.group_size
        stream._it = Feed(stream._it, parallelism, position.doc // size, size)
        return stream

    @property
    def parallelism(self) -> Parallelism:
        return self._stream.parallelism

    @property
    def next_seq(self) -> int:
        return self._stream.next_seq

    @property
    def closed(self) -> bool:
        """Whether the stream has ended or was closed: it switches no more."""
        return self._stream.closed

    def switch(self, parallelism: Parallelism) -> PendingSwitch:
        """Runs the stream with `parallelism` from the next batch taken on (the last asked
        wins); wait on the returned `PendingSwitch` for it to be made."""
        asked = PendingSwitch(parallelism)
        with self._lock:
            replaced, self._pending = self._pending, asked
        if replaced is not None:
            replaced._end(False)
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
        asked._end(False)

    def __iter__(self) -> Iterator[Produced]:
        return self

    def __next__(self) -> Produced:
        with self._lock:  # a switch asked while one is being made waits for its handover
            asked = None
            if not self._stream._it.handing_over:
                asked, self._pending = self._pending, None
        if self._stream.stale:  # an audit found the backend wrong: the reference from here
            self._stream.stale = False  # once: a stage that will not open goes on as it was
            self._switch(self._stream.parallelism, again=True)
        if asked is not None:
            self._hand_over(asked)
        return next(self._stream)

    def _hand_over(self, asked: PendingSwitch) -> None:
        """Opens `asked.to` beside the running stage; `asked` ends at the handover."""
        stream, wanted = self._stream, asked.to
        if stream.closed or wanted == stream.parallelism:
            asked._end(False)
            return

        def open_at(group: int):
            groups = self.pipeline.groups(group * self.pipeline.group_size, stream._encode)
            return iter(parallel(groups, processes=wanted.processes, threads=wanted.threads))

        def done(made: bool) -> None:
            if made:
                stream.parallelism = wanted
                self.switches += 1
            elif not stream.closed:
                self.failed_switches += 1
            asked._end(made)

        end = math.ceil(len(stream._encode.order) / self.pipeline.group_size)
        if not stream._it.hand_over(wanted, open_at, done, end=end):
            # Too few groups left for a handover (a short stream's groups are few and long):
            # the new stage opens where the next batch starts.
            made = False
            try:
                made = self._switch(wanted)
            finally:
                asked._end(made)

    def _switch(self, wanted: Parallelism, again: bool = False) -> bool:
        """Opens the stage at `wanted` where the next batch starts and closes the old one
        (`again`: even at the same parallelism, its worker processes made anew); whether it
        did."""
        current = self._stream.parallelism
        if not self._stream.closed and (again or wanted != current):
            old = self._stream
            try:
                new = self._open(old.position(), wanted)
            except Exception:  # noqa: BLE001 - the stream goes on as it was
                log.warning(
                    "switching to %d processes x %d threads failed; the stream goes on at %d x %d",
                    wanted.processes,
                    wanted.threads,
                    current.processes,
                    current.threads,
                    exc_info=True,
                )
                self.failed_switches += 1
                return False
            self._stream = new
            # Counted before the old stage stops: its workers' exits are not deaths.
            self.switches += 1
            try:
                old.close()
            except Exception:  # noqa: BLE001 - e.g. Grain's teardown tripping over its pipe
                log.warning("closing the stage switched from failed", exc_info=True)
            return True  # and the old stage's worker processes are gone
        return False

    def worker_processes(self) -> list[tuple[int, BaseProcess]]:
        return self._stream.worker_processes()

    def close(self) -> None:
        try:
            self._stream.close()
        finally:  # even a failing close ends the switch waited on: its asker must not hang
            with self._lock:
                asked, self._pending = self._pending, None
            if asked is not None:
                asked._end(False)

    def __enter__(self) -> SwitchingStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
