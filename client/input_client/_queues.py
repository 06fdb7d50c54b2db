"""A bounded queue's put that gives up when told to stop (shared by client and server threads)."""

from __future__ import annotations

import queue
import threading
from typing import Any


def put_unless_stopped(q: queue.Queue, item: Any, stop: threading.Event,
                       poll_s: float = 0.1) -> bool:
    """Puts `item`, waiting for room; returns False, without putting it, once `stop` is set.

    A producer blocked on a full queue must still notice that its consumer is gone, so it
    waits in short slices rather than forever.
    """
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False
