"""`input-server tune` and any program that tunes then exits: a candidate cut by the time
limit while Grain starts its worker processes is closed before the interpreter exits, so no
Grain finalizer traceback and no leaked shared memory follows the result."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Time limits set inside the children's start-up: a measure of time, run alone.
pytestmark = pytest.mark.alone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The public API, then a plain exit: what scripts and benchmarks do. One candidate of worker
# processes, its time limit well inside their start (a spawned interpreter imports Grain).
CHILD = textwrap.dedent(
    """
    import sys
    from input_client.spec import PipelineSpec
    from input_server import autotune
    from input_server.batching.parallelism import Parallelism
    from input_server.batching.pipeline import Pipeline

    if __name__ == "__main__":  # Grain spawns its workers: they import this module
        pipeline = Pipeline(PipelineSpec.from_toml(sys.argv[1]))
        t = autotune.tune(
            pipeline, candidates=[Parallelism(2, 1)], tune_seconds=float(sys.argv[2])
        )
        print(t.reason)
    """
)
EXIT_FAULTS = ("Traceback", "leaked", "Exception ignored")


@pytest.fixture
def spec_file(tmp_path, corpus, spm_model) -> str:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nmodel = "{spm_model}"\n'
        f"[batch]\nseq_len = 256\nsize = 4\n[order]\nepochs = 0\n"
    )
    return str(spec)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "client")])}


def _clean(err: str) -> bool:
    return not any(fault in err for fault in EXIT_FAULTS)


def test_a_program_that_tunes_then_exits_leaves_no_grain_tracebacks(tmp_path, spec_file):
    script = tmp_path / "tune_and_exit.py"
    script.write_text(CHILD)
    # Cut at different moments of their workers' start (on the code before the fix, each exit
    # during a start printed Grain's finalizer tracebacks: 2 of 4 runs alone). One at a time,
    # as it measures time.
    for seconds in ("0.5", "0.8", "1.2"):
        done = subprocess.run(
            [sys.executable, str(script), spec_file, seconds],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
        )
        out, err = done.stdout, done.stderr
        assert done.returncode == 0, err
        assert out.strip(), err  # the tuning finished and said why
        assert _clean(err), err[-3000:]


def test_tune_command_cut_while_starting_processes_exits_without_tracebacks(spec_file):
    # A target no candidate meets sends the search on to worker processes; the time limit cuts
    # their candidate while it starts them (the row "skipped: time limit").
    done = subprocess.run(
        [sys.executable, "-m", "input_server.cli", "tune", spec_file]
        + ["--tune-seconds", "5", "--target-batches-per-s", "100000"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "choice:" in done.stdout
    assert _clean(done.stderr), done.stderr[-3000:]


# Batches freed just before a plain exit, on Grain's free thread (as the last batches of a
# stream closed at exit are): each run leaked some on the code before the flush (2 of 3 runs).
FREES = textwrap.dedent(
    """
    import numpy as np
    from grain._src.python.ipc.shared_memory_array import SharedMemoryArray
    from input_server.batching import grain_adapter

    grain_adapter.flush_at_exit()
    SharedMemoryArray.enable_async_del(1)  # what Grain's worker-process prefetch turns on
    for _ in range(20):
        made = SharedMemoryArray((4096,), np.int32)
        metadata = made.metadata
        del made
        received = SharedMemoryArray.from_metadata(metadata)
        received.unlink_on_del()
        del received
    """
)


def test_batches_freed_just_before_exit_leave_no_shared_memory(tmp_path):
    script = tmp_path / "free_and_exit.py"
    script.write_text(FREES)
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=_env()
        )
        assert done.returncode == 0, done.stderr
        assert _clean(done.stderr), done.stderr[-3000:]
