"""What every stream needs but listening does not, loaded after the server listens; and what
no stream needs, kept out of a `serve` process.

Grain is imported on first use (`batching.grain_adapter`), not before the socket listens; it
is loaded here on a daemon thread as soon as the server listens, so the first stream (a
restarted sidecar's client is already waiting) finds it loaded or loading. A stream that needs
it first imports it itself; Python's import lock lets one thread load a module while the other
waits. JAX, which Grain would import with it, is kept out of `serve` (`keep_jax_out`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_started = threading.Lock()
NO_JAX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_jax")


def keep_jax_out() -> Callable[[], None]:
    """Makes `import jax` fail in this process and the worker processes it spawns, unless JAX
    is loaded already: a folder whose `jax` raises ImportError (`no_jax`) goes first on
    `sys.path`, which spawned processes inherit. The server tokenizes and packs on the CPU
    with numpy; JAX is the trainer's. Grain imports it only if it can (for its pytree
    functions and profiler), and that import was most of Grain's, the GIL held, between a
    restarted sidecar and its first batch, and again in each worker process it starts
    (docs/benchmarks.md, "Time to a first batch after a (re)start"). Returns what undoes it,
    for a process that goes on after `serve` returns (a test calling the CLI in-process)."""
    if "jax" in sys.modules or NO_JAX in sys.path:
        return lambda: None
    sys.path.insert(0, NO_JAX)

    def undo() -> None:
        with contextlib.suppress(ValueError):
            sys.path.remove(NO_JAX)

    return undo


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
