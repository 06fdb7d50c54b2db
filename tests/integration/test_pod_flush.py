"""StepTimer's `flush()` on a real two-process JAX job (CPU, gloo) whose processes timed
different numbers of steps: every process raises, naming the windows, and none waits for a
gather the other never joins (it did: the process with no last window returned, the other hung).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

CHILD = """
import sys
import jax

pid, port, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
    initialization_timeout=60,
)
import jax.numpy as jnp
from input_client import StepTimer

timer = StepTimer(pod_every=10)
step = jax.jit(lambda x: x + 1)
x = jnp.zeros(4)
for _ in range(steps):
    x = timer.step(step, x)
try:
    timer.flush()
    print("flushed", len(timer.pod_steps), flush=True)
except RuntimeError as e:
    print("raised:", e, flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(steps: tuple[int, int]) -> list[str]:
    """Each process's last line of output, the job killed after 120 s."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(i), str(port), str(n)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, n in enumerate(steps)
    ]
    outs = []
    try:
        for child in children:
            out, _ = child.communicate(timeout=120)
            outs.append(out)
    finally:
        for child in children:
            child.kill()
    return [o.strip().splitlines()[-1] if o.strip() else "" for o in outs]


def test_a_flush_after_different_step_counts_raises_on_every_process():
    lines = _job((20, 21))
    for line in lines:
        assert line.startswith("raised: StepTimer's processes gathered different windows"), lines


def test_a_flush_after_the_same_steps_gathers_the_last_short_window():
    assert _job((13, 13)) == ["flushed 13", "flushed 13"]
