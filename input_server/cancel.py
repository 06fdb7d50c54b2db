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
def scope(event: threading.Event) -> Iterator[None]:
    """Within the block, `check()` on this thread raises once `event` is set."""
    outer = getattr(_local, "event", None)
    _local.event = event
    try:
        yield
    finally:
        _local.event = outer


def current() -> threading.Event | None:
    """The event of this thread's scope, if any (to hand to helper threads)."""
    return getattr(_local, "event", None)


def check() -> None:
    """Raises `CancelledError` when the request this thread works for was cancelled."""
    event = getattr(_local, "event", None)
    if event is not None and event.is_set():
        raise CancelledError("the client cancelled the request (or its deadline passed).")
