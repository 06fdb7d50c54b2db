"""Cancellation that reaches a request's blocking steps (globbing, indexing files, learning
from a sample, waiting for or running a tuning): the RPC thread enters `scope(event)` with an
event set when the client leaves, and each step calls `check()` between units of work.

Thread-local, so that deep code (a reader indexing a file) needs no extra argument; outside a
scope (the CLI, Grain's worker processes) `check()` does nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from input_server.errors import CancelledError

_local = threading.local()


@contextlib.contextmanager
def scope(*events: threading.Event) -> Iterator[None]:
    """Within the block, `check()` on this thread raises once any of `events` is set (the
    client left; the server is draining)."""
    outer = getattr(_local, "events", ())
    _local.events = events
    try:
        yield
    finally:
        _local.events = outer


def check() -> None:
    """Raises `CancelledError` when the request this thread works for was cancelled."""
    if any(e.is_set() for e in getattr(_local, "events", ())):
        raise CancelledError(
            "the request was cancelled (the client left, its deadline "
            "passed, or the server is shutting down)."
        )
