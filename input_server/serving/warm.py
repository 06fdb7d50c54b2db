"""What every stream needs but a `serve` process's path to its socket does not, loaded before it
answers; and what no stream needs, kept out of a `serve` process.

Grain is imported on first use (`batching.grain_adapter`), not while `serve` parses its
arguments and binds. It is loaded before the server answers a call, on the thread that starts
it: its import swaps `builtins.__import__` process-wide for a moment (its Parquet module
imports pyarrow inside `etils.epy.lazy_imports()`), and a call that ran a `from ... import` on
another thread in that moment got a `LazyModule` where a function should be (issue 50). JAX,
which Grain would import with it, is kept out of `serve` (`keep_jax_out`), which leaves
Grain's import a fraction of a second (docs/benchmarks.md, "Time to a first batch after a
(re)start").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

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


def load() -> None:
    """Imports Grain (once a process; a failure is logged: a stream's own import reports it
    by name)."""
    start = time.perf_counter()
    try:
        import grain  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a stream's own import reports it by name
        log.warning("loading Grain failed (%s: %s)", type(e).__name__, e)
        return
    log.debug("Grain loaded in %.2f s", time.perf_counter() - start)
