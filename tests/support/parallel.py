"""Tests in parallel (pytest-xdist): what the workers of one run share, and the machine one
test may hold alone."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator


def run_dir(config) -> pathlib.Path:
    """The folder every pytest-xdist worker of this run shares (each worker's basetemp lies in
    it); in one process, the machine's temporary folder."""
    import tempfile

    if getattr(config, "workerinput", None) is None:
        return pathlib.Path(tempfile.gettempdir())
    return pathlib.Path(config.option.basetemp).parent


@contextlib.contextmanager
def file_lock(path: pathlib.Path, *, shared: bool = False) -> Iterator[None]:
    """`path` locked (flock) for the block: alone, or `shared` with other shared holders."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_share(folder: pathlib.Path, *, alone: bool) -> Iterator[None]:
    """The machine for one test: `alone` (no other worker's test runs meanwhile) or beside
    others. A test that waits to run alone holds the gate, so the tests that start after it
    wait too and it is not starved by a stream of shared holders."""
    with contextlib.ExitStack() as held:
        with file_lock(folder / "gate.lock"):
            held.enter_context(file_lock(folder / "machine.lock", shared=not alone))
        yield
