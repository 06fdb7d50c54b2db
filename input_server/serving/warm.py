"""What every stream needs but a `serve` process's path to its socket does not, loaded behind
the socket; and what no stream needs, kept out of a `serve` process.

Grain is imported on first use (`batching.grain_adapter`), not while `serve` parses its
arguments and binds. The server starts answering first and loads it on a thread of its own
(`load_behind`); a stream waits for that load (`wait_loaded`, at its admission), other calls
do not. Its
import swaps `builtins.__import__` process-wide for a moment (its Parquet module imports pyarrow
inside `etils.epy.lazy_imports()`), and a call that ran a `from ... import` on another thread in
that moment got a `LazyModule` where a function should be (issue 50): gRPC itself runs one for
every call. While the loading thread imports, `etils.epy.lazy_imports` is one that makes that
thread's imports lazy and no other's (`_lazy_here`); where etils lacks the function it builds
on, Grain is loaded before the server answers, as before. JAX, which Grain would import with
it, is kept out of `serve` (`keep_jax_out`), which leaves Grain's import a fraction of a second
(docs/benchmarks.md, "Time to a first batch after a (re)start").
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

NO_JAX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_jax")
# Set once Grain's load (`load_behind`) has ended, either way.
_LOADED = threading.Event()
_LOADED.set()  # until a load behind starts: nothing to wait for
_STARTING = threading.Lock()


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


def load_behind() -> bool:
    """Loads Grain on a thread of its own, its lazy imports its own (`_lazy_here`); False
    (nothing started) where etils' lazy imports cannot be made so (etils missing, or not as
    `_etils_lazy` knows it): the caller loads it before answering."""
    with _STARTING:  # two servers starting at once start one load
        if "grain" in sys.modules or not _LOADED.is_set():
            return True
        found = _etils_lazy()
        if found is None:
            return False
        epy, lazy_import = found
        _LOADED.clear()

        def run() -> None:
            try:
                with _lazy_here(epy, lazy_import):
                    load()
            finally:
                _LOADED.set()

        try:
            threading.Thread(target=run, name="load-grain", daemon=True).start()
        except BaseException:
            _LOADED.set()
            raise
    return True


def wait_loaded(timeout: float | None = None) -> bool:
    """Waits for a load behind (`load_behind`) to end; whether it has."""
    return _LOADED.wait(timeout)


def _etils_lazy() -> tuple[object, Callable] | None:
    """etils' `epy` module and the lazy `__import__` its `lazy_imports` puts in `builtins`
    (`_lazy_import(name, globals, locals, fromlist, level, *, error_callback,
    success_callback)`), or None where etils is missing or not so."""
    try:
        from etils import epy

        lazy_import = sys.modules[epy.lazy_imports.__module__]._lazy_import
        keywords = inspect.signature(lazy_import).parameters
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return None
    if not {"error_callback", "success_callback"} <= keywords.keys():
        return None
    return epy, lazy_import


@contextlib.contextmanager
def _lazy_here(epy, lazy_import: Callable) -> Iterator[None]:
    """`epy.lazy_imports` replaced, meanwhile, by one whose lazy `__import__` serves only the
    thread inside its block: etils' own puts its lazy `__import__` in `builtins` for every
    thread (`lazy_import`: the function it puts there, made the same way). Each put back only
    if it is still what was put there (another swap may have come between)."""
    original = epy.lazy_imports

    @contextlib.contextmanager
    def this_thread_only(*, error_callback=None, success_callback=None) -> Iterator[None]:
        real, owner, active = builtins.__import__, threading.get_ident(), [True]
        lazy = functools.partial(
            lazy_import, error_callback=error_callback, success_callback=success_callback
        )

        def dispatch(*args, **kwargs):
            # After the block, or on another thread (a thread's ident is reused once it ends):
            # the import it came in place of.
            here = active[0] and threading.get_ident() == owner
            return (lazy if here else real)(*args, **kwargs)

        builtins.__import__ = dispatch
        try:
            yield
        finally:
            active[0] = False
            if builtins.__import__ is dispatch:
                builtins.__import__ = real

    epy.lazy_imports = this_thread_only
    try:
        yield
    finally:
        if epy.lazy_imports is this_thread_only:
            epy.lazy_imports = original
