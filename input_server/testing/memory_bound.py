"""A server or command bounded by a memory cgroup, and the peak memory it reached: tests and
benches that could allocate gigabytes run so, and a regression kills the server, not the host.

The cgroup (v1 or v2, where this process may make one) is `processes.memory_cgroup`'s, the
server `processes.cgroup_server`'s; where no cgroup can be made, a server runs in none (a
bench says so) and a test skips (`can_bound_memory`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence

from input_server.testing.processes import cgroup_server, memory_cgroup

# How often the resident memory is sampled: a 50 ms spike is long next to an allocation of
# gigabytes, short next to the seconds a test runs.
_SAMPLE_S = 0.05


def can_bound_memory() -> bool:
    """Whether a memory cgroup can be made here (one is made and removed to find out)."""
    with memory_cgroup(0.25) as procs:
        return procs is not None


def enter_cgroup(procs: str) -> Callable[[], None]:
    """A `preexec_fn` moving the child into the cgroup whose `cgroup.procs` file is `procs`
    before it execs: all it starts is inside too."""

    def enter() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    return enter


def run_bounded(argv: Sequence[str], gb: float) -> None:
    """Runs `argv` to its end in a memory cgroup of `gb` GB of its own (in none where none can
    be made): a command that builds a large input holds gigabytes while it writes.

    Raises:
      subprocess.CalledProcessError: it failed, or was killed at the bound.
    """
    with memory_cgroup(gb) as procs:
        subprocess.run(list(argv), check=True, preexec_fn=enter_cgroup(procs) if procs else None)


class PeakMemory:
    """The resident memory of a process and all it started (its workers), at its highest since
    this began watching: sampled by a daemon thread until `stop`."""

    def __init__(self, pid: int):
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, args=(pid,), name="peak-memory", daemon=True
        )
        self._thread.start()

    def _watch(self, pid: int) -> None:
        import psutil

        try:
            root = psutil.Process(pid)
        except psutil.Error:
            return
        while not self._stop.wait(_SAMPLE_S):
            total = 0
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:  # the server is gone
                return
            for p in tree:
                with contextlib.suppress(psutil.Error):  # a worker that just exited
                    total += p.memory_info().rss
            self.bytes = max(self.bytes, total)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclasses.dataclass(frozen=True)
class BoundedServer:
    """A running `input-server serve` in a memory cgroup.

    Attributes:
      target: its Unix-socket address.
      process: its process (`poll()` is None while it lives).
      gb: the cgroup's bound; None where no cgroup could be made (the server runs in none).
      peak: its resident memory at its highest, workers included (`peak.bytes`).
    """

    target: str
    process: subprocess.Popen
    gb: float | None
    peak: PeakMemory
    procs: str | None  # the cgroup's `cgroup.procs` file

    def cgroup_peak(self) -> int | None:
        """The cgroup's own record of its most memory (page cache included): v1's
        `memory.max_usage_in_bytes`, v2's `memory.peak`; None where the kernel keeps none."""
        if self.procs is None:
            return None
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(os.path.dirname(self.procs), name)) as f:
                    return int(f.read())
        return None


@contextlib.contextmanager
def bounded_server(
    root: str, *flags: str, gb: float, log: str | None = None
) -> Iterator[BoundedServer]:
    """`input-server serve FLAGS` reading `root`, on a Unix socket there, in a memory cgroup of
    `gb` GB of its own, serving and watched for its peak memory; stopped (and the cgroup
    removed) when the block ends. Its output goes to `log` (appended) or nowhere."""
    with (
        memory_cgroup(gb) as procs,
        cgroup_server(root, *flags, procs=procs, log=log) as (target, p),
    ):
        peak = PeakMemory(p.pid)
        try:
            yield BoundedServer(target, p, gb if procs else None, peak, procs)
        finally:
            peak.stop()
