"""A batch stream whose parallelism may change between two batches, the data unchanged.

The batches are the same bytes for any processes x threads, and a stream opened at a position
yields exactly the batches that follow it (`resume.Position`). So a switch is: note where the
next batch starts, open the new parallel stage there, close the old one. Nothing is lost or
repeated; the groups the old stage had read ahead are read again by the new one. The switch
is asked for from any thread and made by the consuming thread before its next batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

from input_server.batching.meter import LiveMeter
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline, Produced
from input_server.batching.resume import Position

log = logging.getLogger(__name__)


class SwitchingStream:
    """`BatchStream`'s interface, with `switch(parallelism)` taking effect at the next batch."""

    def __init__(
        self,
        pipeline: Pipeline,
        position: Position,
        parallelism: Parallelism,
        *,
        meter: LiveMeter | None = None,
    ):
        self.pipeline = pipeline
        self.meter = meter
        self._stream = pipeline.stream(position, parallelism=parallelism, meter=meter)
        self._pending: Parallelism | None = None
        self._lock = threading.Lock()
        self.switches = 0  # stages opened after the first (the watchdog's generations)
        self.closed_switches = 0  # of which the old stage is closed
        self.failed_switches = 0  # asked for, but the new stage would not open

    @property
    def parallelism(self) -> Parallelism:
        return self._stream.parallelism

    @property
    def next_seq(self) -> int:
        return self._stream.next_seq

    def switch(self, parallelism: Parallelism) -> None:
        """Runs the batches after the next one asked for with `parallelism` (the last asked
        wins)."""
        with self._lock:
            self._pending = parallelism

    def __iter__(self) -> Iterator[Produced]:
        return self

    def __next__(self) -> Produced:
        with self._lock:
            wanted, self._pending = self._pending, None
        current = self._stream.parallelism
        if wanted is not None and not self._stream.closed and wanted != current:
            old = self._stream
            try:
                new = self.pipeline.stream(old.position(), parallelism=wanted, meter=self.meter)
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
                return next(self._stream)
            self._stream = new
            # Counted before the old stage stops: its workers' exits are not deaths.
            self.switches += 1
            try:
                old.close()
            except Exception:  # noqa: BLE001 - e.g. Grain's teardown tripping over its pipe
                log.warning("closing the stage switched from failed", exc_info=True)
            self.closed_switches += 1  # its worker processes are gone
        return next(self._stream)

    def worker_processes(self) -> list[tuple[int, BaseProcess]]:
        return self._stream.worker_processes()

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> SwitchingStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
