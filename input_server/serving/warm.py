"""What every stream needs but listening does not, loaded after the server listens.

Grain, and the JAX it imports, took 1.2-1.6 s of a 2-core host's 1.7-3.5 s from `serve` to its
socket; imported on first use instead (`batching.grain_adapter`), they are loaded here on a daemon
thread as soon as the server listens, so the first stream (a restarted sidecar's client is
already waiting) finds them loaded or loading. A stream that needs them first imports them
itself; Python's import lock lets one thread load a module while the other waits.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

_started = threading.Lock()


def _load() -> None:
    start = time.perf_counter()
    try:
        import grain  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a stream's own import reports it by name
        log.warning("loading Grain after listening failed (%s: %s)", type(e).__name__, e)
        return
    log.debug("Grain loaded after listening in %.2f s", time.perf_counter() - start)


def load_in_background() -> None:
    """Starts loading what streams need (once a process), without waiting for it."""
    if _started.acquire(blocking=False):
        threading.Thread(target=_load, name="warm-imports", daemon=True).start()
