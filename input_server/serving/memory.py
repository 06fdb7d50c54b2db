"""Giving memory back once the server is idle: the C allocator's free pages, after the last
stream ends.

A long-document stream's groups, token arrays and messages are freed when it ends, but glibc
keeps freed memory in its arenas (one per thread that allocated: the stream's threads) for
reuse, so an idle server went on holding what its busiest stream took (1.2-1.5 GB measured
after long-document streams). `malloc_trim(0)` returns every arena's free pages to the kernel.
It runs only when no stream is left, a moment after the last one ends (the stream drops its
pipeline and queued messages just after its producer ends), so a running stream never waits
on the allocator's locks for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)

# Seconds after the last stream's end before trimming: the service's references go first.
TRIM_DELAY_S = 1.0

_lock = threading.Lock()
_streams = 0
_ended = 0  # streams ended so far: a trim scheduled before a newer end is not the last word


def release_memory() -> bool:
    """Returns the C allocator's free memory to the kernel (glibc's `malloc_trim(0)`); whether
    any was returned. False where the C library has no such call (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def stream_started() -> None:
    global _streams
    with _lock:
        _streams += 1


def stream_ended(delay_s: float = TRIM_DELAY_S) -> None:
    """Counts a stream's end; the last one schedules a trim `delay_s` later, done if the
    server is still idle then."""
    global _streams, _ended
    with _lock:
        _streams = max(0, _streams - 1)
        _ended += 1
        if _streams:
            return
        ended = _ended
    timer = threading.Timer(delay_s, _trim_if_idle, args=(ended,))
    timer.name, timer.daemon = "memory-trim", True
    timer.start()


def _trim_if_idle(ended: int) -> None:
    with _lock:
        if _streams or _ended != ended:  # a stream began (or ended) since: its own turn
            return
    if release_memory():
        log.debug("idle: returned the allocator's free memory to the kernel")
