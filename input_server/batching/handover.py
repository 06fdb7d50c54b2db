"""A stream's next parallel stage, opened beside the running one: the packer reads the running
stage's groups up to the group the new stage starts at, then the new stage's.

Groups are a pure function of their index, and the packer (with what it holds of a row) stays,
so only where the groups come from changes: the batches are the bytes either stage gives.
The new stage starts its threads or worker processes and computes its first group while the
running one still serves; the packer waits for it only if it reaches the handover group
first. `batch_stream.Packer` asks for handovers (`Packer.hand_over`); `Feed` is what it reads.
"""

from __future__ import annotations

import collections
import gc
import logging
import math
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from input_server.batching.grain_adapter import worker_processes
from input_server.batching.parallelism import Parallelism

if TYPE_CHECKING:
    import grain

log = logging.getLogger(__name__)

# How long a stage of worker processes takes from opening to its first group, before one was
# measured on this stream: 2 processes on the 2-core development host gave no batch for ~2 s
# (docs/benchmarks.md, "The live search on fast tokenizers").
PROCESS_START_S = 2.5

# Threads are handed over only when the packer reads the running stage's read-ahead within
# this; else the new stage opens where the next batch starts (a group of a slow loop's may
# last seconds, while new threads compute their first in a group's time).
HANDOVER_MAX_S = 0.5

Element = dict[str, Any]


class Beside:
    """A stage opened at group `at`, its first group computed on a thread of its own."""

    def __init__(self, open_at: Callable[[int], grain.DatasetIterator], to: Parallelism, at: int):
        self.to, self.at = to, at
        self.first: Element | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.started = time.monotonic()
        self.ready_s = 0.0  # opening to its first group
        self._it: grain.DatasetIterator | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self._open, args=(open_at,), name="stage-beside", daemon=True
        )
        self._thread.start()

    def _open(self, open_at: Callable[[int], grain.DatasetIterator]) -> None:
        it = None
        try:
            it = open_at(self.at)
            self.first = next(it)
        except BaseException as e:  # noqa: BLE001 - StopIteration too: no group there
            self.error = e
        with self._lock:
            self._it = it
            closed = self._closed
        self.ready_s = time.monotonic() - self.started
        self.ready.set()
        if closed:
            close_iterator(it)

    def take(self) -> tuple[Element, grain.DatasetIterator]:
        """The stage's first group and its iterator (the groups after it); once ready."""
        first, self.first = self.first, None
        return first, self._it

    def close(self) -> None:
        """Ends the stage (now, or when its first group comes, on its own thread)."""
        with self._lock:
            self._closed = True
            it, self._it = self._it, None
        self.first = None
        close_iterator(it)


def close_iterator(it: grain.DatasetIterator | None, collect: bool = False) -> None:
    """Closes a stage's groups (None: a stage that would not open), `collect`ing its cycles."""
    try:
        if it is not None:
            it.close()
    except Exception:  # noqa: BLE001 - e.g. Grain's teardown tripping over its pipe
        log.warning("closing a stage's groups failed", exc_info=True)
    if collect:  # Grain's iterators hold each other in cycles: free the processes' memory now
        gc.collect()


class Feed:
    """The groups a stream's packer reads: the running stage's, and from a handover's group
    on, the stage opened beside it (`hand_over`).

    Args:
      it: the running stage's groups, in order from group `first`.
      parallelism: the running stage's.
      first: the index of its first group.
      size: documents per group (a group's index is its first document // size).
    """

    def __init__(self, it: grain.DatasetIterator, parallelism: Parallelism, first: int, size: int):
        self._it: grain.DatasetIterator | None = it  # None once closed
        self._first: Element | None = None  # a new stage's first group, read beside
        self.parallelism = parallelism
        self._next = first
        self._size = size
        self._read: collections.deque[float] = collections.deque(maxlen=32)  # when, recent
        self._beside: Beside | None = None
        self._done: Callable[[bool], None] | None = None
        self._process_start_s = PROCESS_START_S
        self.last_ready_s = 0.0  # the latest handover's stage: opening to its first group

    @property
    def handing_over(self) -> bool:
        return self._beside is not None

    def hand_over(
        self,
        to: Parallelism,
        open_at: Callable[[int], grain.DatasetIterator],
        done: Callable[[bool], None],
        *,
        end: int,
    ) -> bool:
        """Opens `to` (`open_at(group)`: its groups from that one) at a group the running
        stage will reach about when `to` has started; `done(made)` says how it ended. False
        (nothing opened; the caller opens `to` where the next batch starts) when the stream's
        `end` groups end first, or when threads would wait for a slow loop's next group."""
        lead = self._lead(to)
        if lead is None or self._next + lead >= end:
            return False
        self._beside, self._done = Beside(open_at, to, self._next + lead), done
        return True

    def _lead(self, to: Parallelism) -> int | None:
        """Groups from the next one to the handover's, or None (no handover)."""
        rate = None  # groups/s the packer reads
        if len(self._read) > 1:
            rate = (len(self._read) - 1) / max(1e-3, self._read[-1] - self._read[0])
        if to.in_process:
            # New threads compute the handover's group while the packer reads what the running
            # stage computes at once; a loop slower than HANDOVER_MAX_S for those is better
            # served at the next batch (its queue covers one group's computing).
            lead = self.parallelism.workers
            return lead if rate is not None and lead / rate <= HANDOVER_MAX_S else None
        return max(1, math.ceil((rate or 0.0) * self._process_start_s))

    def __iter__(self) -> Feed:
        return self

    def __next__(self) -> Element:
        beside = self._beside
        if beside is not None and self._next >= beside.at:
            self._cut(beside)
        element, self._first = self._first, None
        if element is None:
            element = next(self._it)
        self._next = int(element["first_doc"]) // self._size + 1
        self._read.append(time.monotonic())
        return element

    def _cut(self, beside: Beside) -> None:
        """The packer needs the handover's group: from the new stage, once it has it (or on
        from the running stage, if it would not open)."""
        beside.ready.wait()
        self._beside = None
        made = beside.error is None
        done, self._done = self._done, None
        if made:
            old, had_processes = self._it, not self.parallelism.in_process
            (self._first, self._it), self.parallelism = beside.take(), beside.to
            self.last_ready_s = beside.ready_s
            if not beside.to.in_process:
                self._process_start_s = max(0.5, beside.ready_s)
            if done is not None:  # before the old stage stops: its workers' exits are no deaths
                done(True)
            # The old stage's teardown (its worker processes' exits) off the packer's thread.
            threading.Thread(
                target=close_iterator, args=(old, had_processes), name="stage-close", daemon=True
            ).start()
            return
        log.warning(
            "switching to %d processes x %d threads failed; the stream goes on at %d x %d",
            beside.to.processes,
            beside.to.threads,
            self.parallelism.processes,
            self.parallelism.threads,
            exc_info=beside.error,
        )
        beside.close()
        if done is not None:
            done(False)

    def worker_processes(self) -> list[tuple[int, BaseProcess]]:
        """(worker index, process) of each Grain worker process the running stage runs now
        (`grain_adapter.worker_processes`; a stage opened beside is not counted until handed over);
        may raise RuntimeError, then call again."""
        it = self._it
        return [] if it is None else worker_processes(it)

    def close(self) -> None:
        """Ends its stages and lets go of their groups (shared memory, with worker processes)."""
        beside, self._beside = self._beside, None
        if beside is not None:
            beside.close()
        it, self._it, self._first = self._it, None, None
        close_iterator(it)
        done, self._done = self._done, None
        if done is not None:
            done(False)
