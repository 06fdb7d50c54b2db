"""What every stream needs but listening does not, loaded after the server listens; and what
no stream needs, kept out of a `serve` process.

Grain is imported on first use (`batching.grain_adapter`), not before the socket listens; it
is loaded here on a daemon thread as soon as the server listens, so the first stream (a
restarted sidecar's client is already waiting) finds it loaded or loading. A stream that needs
it first imports it itself; Python's import lock lets one thread load a module while the other
waits. JAX, which Grain would import with it, is kept out of `serve` (`keep_jax_out`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

log = logging.getLogger(__name__)

_started = threading.Lock()
# What Grain logs when JAX cannot be imported: it then keeps to its own pure-Python pytrees.
_GRAIN_WITHOUT_JAX = "Failed to load jax profiler"


def keep_jax_out() -> None:
    """Makes `import jax` fail in this process and the worker processes it spawns, unless JAX
    is loaded already: a folder whose `jax` raises ImportError (`no_jax`) goes first on
    `sys.path`, which spawned processes inherit. The server tokenizes and packs on the CPU
    with numpy; JAX is the trainer's. Grain imports it only if it can (for its pytree
    functions and profiler), and that import was most of Grain's, the GIL held, between a
    restarted sidecar and its first batch, and again in each worker process it starts
    (docs/benchmarks.md, "Time to a first batch after a (re)start"). For `serve` processes
    only: a process that trains beside an in-process server (`demo`, tests) keeps its JAX."""
    if "jax" in sys.modules:
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_jax")
    if here not in sys.path:
        sys.path.insert(0, here)
    logging.getLogger("absl").addFilter(
        lambda record: _GRAIN_WITHOUT_JAX not in str(record.getMessage())
    )


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
