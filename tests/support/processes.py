"""Processes a test starts or watches: `input-server serve` from the command line, Grain's
worker processes, memory cgroups, other Pythons."""

from __future__ import annotations

import os
import queue
from collections.abc import Sequence

from input_server.testing.memory_bound import can_bound_memory
from input_server.testing.processes import ChildProcess, cli_argv, find_python


def worker_processes(exclude: set[int] = frozenset()) -> list:
    """Live child processes of this one (Grain's workers), but `exclude` and multiprocessing's
    resource tracker (started once for shared memory, it lives as long as this process)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (
                p.pid not in exclude
                and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())
            ):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def still_running(processes) -> list:
    """Those of `processes` not yet gone (a zombie, waiting to be reaped, counts as gone)."""
    import psutil

    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def needs_memory_cgroup(why: str) -> None:
    """Skips the test where no memory cgroup can be made (it needs a writable /sys/fs/cgroup):
    what it does could take the host down, not just its server."""
    import pytest

    if not can_bound_memory():
        pytest.skip(f"no memory cgroup can be made here: {why}")


def serve_cli(
    *args: str, log: str, env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[ChildProcess, list[str]]:
    """`input-server serve ARGS` started and serving: the process and the targets it printed.
    The caller kills it (`ChildProcess.kill`)."""
    child = ChildProcess(cli_argv("serve", *args), log=log, read_lines=True, env=env)
    try:
        line = child.lines.get(timeout=timeout)
    except queue.Empty:
        line = None
    if not line or "serving on" not in line:
        child.kill()
        with open(log) as f:
            raise AssertionError(f"serve {args} did not start: {f.read()[-2000:]}")
    return child, line.split("serving on ", 1)[1].split()


def serve_files(
    folder, *files: str, flags: Sequence[str] = (), name: str = "s", env=None
) -> tuple[ChildProcess, str]:
    """`input-server serve FLAGS` on the Unix socket `folder`/NAME.sock, allowed to read the
    folders that hold `files` (a `--data-root` each), its output in `folder`/NAME.log: the
    process (the caller kills it) and its target."""
    roots = dict.fromkeys(os.path.dirname(os.path.abspath(f)) for f in files)
    child, targets = serve_cli(
        "--listen",
        f"unix://{folder}/{name}.sock",
        *(arg for root in roots for arg in ("--data-root", root)),
        *flags,
        log=os.path.join(folder, f"{name}.log"),
        env=env,
    )
    return child, targets[0]


def python_or_skip(version: str, why: str) -> str:
    """`find_python(version)`; without it, a skip here and a failure in CI (which has it)."""
    import pytest

    found = find_python(version)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"Python {version} is not installed; CI needs it for {why}.")
        pytest.skip(f"Python {version} is not installed here ({why})")
    return found
