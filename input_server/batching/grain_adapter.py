"""Everything that touches Grain: the parallel stage, its worker processes, absl flags.

The one module to read (and re-check) when Grain changes: it uses Grain's public dataset API
to run the per-group work in threads and processes, and walks Grain's iterator internals to
find the worker processes (which Grain lists nowhere public).
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import threading
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grain

# Grain is imported where a stream first needs it, not with this module: the server listens
# before it (`serving.warm`, which also keeps the JAX Grain would import out of `serve`).


def ensure_absl_flags_parsed() -> None:
    # Grain reads absl flags; entry points that do not use absl must mark them parsed.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


# The signal Linux sends a worker when the thread that started it ends (PR_SET_PDEATHSIG).
# One whose default action is to ignore it: while a worker's interpreter shuts down (a clean
# stop), Python has put the default actions back, and SIGUSR2's (terminate) killed it
# mid-exit (exit code -12) when the thread ended at that moment.
PARENT_DEATH_SIGNAL = signal.SIGURG


def _die_with_parent(server_pid: int, worker_index: int, worker_count: int) -> None:
    """Runs in each Grain worker process: exit when the server process dies, so a SIGKILLed
    server leaves no orphaned workers (Grain stops them only on a clean close).

    Linux sends the PR_SET_PDEATHSIG signal when the *thread* that started the process ends,
    and Grain starts each worker from a prefetch thread that ends when the stream closes. With
    SIGKILL there, every cancelled stream's workers were killed in the middle of Grain's clean
    stop, leaking the shared memory (/dev/shm/psm_*) of the elements they held. So the signal
    is one the worker handles: it exits only if its parent process is gone (the kernel sends
    it again each time the worker is handed to another of the server's threads, and at last
    to init or a subreaper, which changes `getppid()`); otherwise Grain stops it cleanly.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return

    def exit_if_orphaned(*_) -> None:
        if os.getppid() != server_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    signal.signal(PARENT_DEATH_SIGNAL, exit_if_orphaned)
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, PARENT_DEATH_SIGNAL)
    exit_if_orphaned()  # the server may have died before prctl


# Grain frees a batch's shared memory on a background thread (it turns that on when it starts
# worker processes), and multiprocessing ends that thread at exit with whatever is still
# queued: a batch dropped just before a program exits leaked its segment (the resource
# tracker's "leaked shared_memory objects" warning, 1 in 3 runs of a tune cut short).
FREE_WAIT_S = 5.0
_flush_registered = threading.Lock()


def flush_shared_memory_frees(timeout: float = FREE_WAIT_S) -> bool:
    """Waits up to `timeout` s for the shared-memory frees Grain has queued so far; whether
    they are done. Grain's free pool runs its tasks in order on one thread
    (`SharedMemoryArray.enable_async_del(1)`, checked against grain 0.2.18), so a no-op queued
    after them ends after them."""
    from grain._src.python.ipc.shared_memory_array import SharedMemoryArray

    frees = SharedMemoryArray._del_thread_pool
    if frees is None:
        return True
    try:
        frees.apply_async(int).wait(timeout)
    except ValueError:  # the pool was already closed
        return False
    return True


def flush_at_exit() -> None:
    """Makes this process wait for Grain's queued shared-memory frees when it exits (once)."""
    # Registered after multiprocessing's own exit handler (imported by then), so it runs
    # first (atexit is last in, first out), while the free thread still runs.
    if _flush_registered.acquire(blocking=False):
        atexit.register(flush_shared_memory_frees)


def parallel(groups: grain.MapDataset, *, processes: int, threads: int) -> grain.IterDataset:
    """`groups` computed `threads` at a time in each of `processes` worker processes (0 = in
    this process), in order."""
    import grain

    ds = groups.to_iter_dataset(
        grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
    )
    if processes > 0:
        ensure_absl_flags_parsed()
        flush_at_exit()
        ds = ds.mp_prefetch(
            grain.MultiprocessingOptions(num_workers=processes),
            worker_init_fn=functools.partial(_die_with_parent, os.getpid()),
        )
    return ds


def worker_processes(iterator: Any) -> list[tuple[int, BaseProcess]]:
    """(worker index, process) of each Grain worker process this stream runs now.

    Grain keeps them inside its iterators (one `ProcessPrefetchDatasetIterator` per worker,
    at the worker's index in the interleave's lists) and lists them nowhere public, so this
    walks the iterator graph (checked against grain 0.2.18). A worker whose iterator the
    interleave has not taken up yet is not found; it is found once the stream waits on it,
    which is when its death matters. May raise RuntimeError if the graph changes under the
    walk; call again.
    """
    import grain

    found, seen = [], set()
    todo = [(iterator, 0)]
    while todo:
        node, slot = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for name, value in list(vars(node).items()):
            if name == "_prefetch_process" and isinstance(value, BaseProcess):
                found.append((slot, value))
            children = [(value, slot)]
            if isinstance(value, list):
                children = [(v, i) for i, v in enumerate(value)]
            for child, child_slot in children:
                for c in child if isinstance(child, tuple) else (child,):
                    if isinstance(c, grain.DatasetIterator):
                        todo.append((c, child_slot))
    return found
