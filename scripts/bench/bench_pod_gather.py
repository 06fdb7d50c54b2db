"""Benchmark: what `StepTimer`'s pod view costs a step, with against without, on several JAX
processes on this host's CPU (gloo collectives).

    python scripts/bench/bench_pod_gather.py [--processes 2] [--steps 200] [--rounds 4]
        [--pod-every 10] [--out FILE.json]

Each process runs the same lock-step train step (a matmul on its own device and an all-reduce
across the processes, as a data-parallel step has), timed by `StepTimer`: in alternating rounds
with `pod_every=0` (no gather: the timer of before) and with `pod_every=N`, so both see the same
host load. Per round, the loop's real seconds a step (`total_wall_s / steps` of the summary, every
step after the first); the cost is the median with minus the median without. Beside it, the
gather alone: a window's `PodGather.submit` and `collect` back to back, timed 100 times (on CPU
the dispatch returns once every process has joined, so it holds the processes' skew too).
Process 0's figures, printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

from input_server.testing.results import emit_json

GATHERS = 100


def _worker(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.processes,
        process_id=args.worker,
        initialization_timeout=120,
    )
    from input_client.pod import PodGather
    from input_client.timing import StepTimer

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    local = np.full((1, 128, 128), 1e-3, np.float32)
    x = jax.make_array_from_process_local_data(rows, local, (args.processes, 128, 128))

    @jax.jit
    def train_step(x):
        y = jnp.tanh(x @ x)
        return y, y.sum()  # the sum: an all-reduce across the processes, as a real step has

    jax.block_until_ready(train_step(x))
    per_step: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(2 * args.rounds):
        mode = "without" if r % 2 == 0 else "with"
        timer = StepTimer(pod_every=0 if mode == "without" else args.pod_every)
        for _ in range(args.steps + 1):
            x, _ = timer.step(train_step, x)
        timer.flush()
        s = timer.summary()
        per_step[mode].append(s["total_wall_s"] / s["steps"])
    gather = PodGather(args.pod_every)
    waits = list(np.random.default_rng(0).random(args.pod_every))
    times = []
    for i in range(GATHERS):
        start = time.perf_counter()
        gather.submit(i * args.pod_every, waits, waits)
        gather.collect()
        times.append(time.perf_counter() - start)
    jax.distributed.shutdown()
    without = statistics.median(per_step["without"])
    with_ = statistics.median(per_step["with"])
    return {
        "process": args.worker,
        "step_ms_without": without * 1e3,
        "step_ms_with": with_ * 1e3,
        "cost_per_step_ms": (with_ - without) * 1e3,
        "rounds_ms": {k: [v * 1e3 for v in vs] for k, vs in per_step.items()},
        "gather_ms_median": statistics.median(times) * 1e3,
        "gather_ms_p90": sorted(times)[int(0.9 * len(times))] * 1e3,
        "gather_per_step_ms": statistics.median(times) * 1e3 / args.pod_every,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--steps", type=int, default=200, help="timed steps a round")
    p.add_argument("--rounds", type=int, default=4, help="rounds without and with, alternating")
    p.add_argument("--pod-every", type=int, default=10)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        print(json.dumps(_worker(args)), flush=True)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # one device a process
    base = [
        sys.executable, os.path.abspath(__file__), "--processes", str(args.processes),
        "--steps", str(args.steps), "--rounds", str(args.rounds),
        "--pod-every", str(args.pod_every), "--port", str(port),
    ]  # fmt: skip
    children = [
        subprocess.Popen(
            [*base, "--worker", str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for i in range(args.processes)
    ]
    outputs = [child.communicate(timeout=900) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        if child.returncode != 0:
            sys.stderr.write(err.decode()[-3000:])
            return 1
    results = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]
    import jax

    emit_json(
        {
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "host": f"{platform.node()} ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})",
            "jax": jax.__version__,
            "processes": args.processes,
            "pod_every": args.pod_every,
            "steps_a_round": args.steps,
            "rounds": args.rounds,
            **{k: v for k, v in results[0].items() if k != "process"},
            "others": results[1:],
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
