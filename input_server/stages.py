"""The stages a stream's time is counted in (`input-server stats`, the metrics), and the clock
of the worker stages.

A group is read and tokenized on one worker thread (in the server or in a Grain worker
process), so what it spends in each worker stage is counted on that thread and travels back
with the group (`encode.STAGES_KEY`); the stream's own threads count the rest
(`meter.LiveMeter.add`). Names are fixed: they are the metrics' only stage labels.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

# Summed over every worker thread and process: "read" is reading records (decompression
# apart), "decompress" inflating a compressed file (once per process that reads it).
WORKER_STAGES = ("read", "decompress", "tokenize")
# The stream's own threads: the in-order packer waiting for the next tokenized group, packing,
# the producer waiting for room in the send queue, making messages, gRPC taking them, and the
# sender waiting for the client's credit.
STREAM_STAGES = ("wait_workers", "pack", "queue_full", "encode", "send", "credit_wait")
STAGES = WORKER_STAGES + STREAM_STAGES

_thread = threading.local()


@contextlib.contextmanager
def counting() -> Iterator[dict[str, float]]:
    """Counts what this thread spends in `timed` stages meanwhile (a group's work)."""
    outer = getattr(_thread, "tally", None)
    tally = _thread.tally = dict.fromkeys(WORKER_STAGES, 0.0)
    try:
        yield tally
    finally:
        _thread.tally = outer


@contextlib.contextmanager
def timed(stage: str) -> Iterator[None]:
    """Adds the time inside to `stage` of this thread's `counting` tally, if one is open (a
    file decompressed while a pipeline is set up is nobody's stream time)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        tally = getattr(_thread, "tally", None)
        if tally is not None:
            tally[stage] += time.perf_counter() - started
