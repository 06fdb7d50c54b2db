"""What the client costs a training loop, per step, side by side in one run; prints JSON.

    python scripts/bench/bench_client_cost.py [--steps 100] [--rounds 3] [--size 16]
        [--seq-len 2048] [--dispatch-ms 1.0] [--device-ms 40] [--prefetch 2] [--devices 8]
        [--json OUT]

A server in its own process (`input-server serve`, a Unix socket, as a sidecar) streams the
standard library's docstrings (a sentencepiece model trained on them, `first_fit`). The loop of
each case is a stand-in for a train step: take a batch, hold the GIL for `--dispatch-ms` of pure
Python (the step's dispatch), then sleep `--device-ms` (device time, GIL released). Cases:

- `numpy`: a pre-made numpy batch, the same each step (the loop's own floor);
- `server`: `InputClient.batches()`;
- `device_resident`, `host_put`, `server_sharding` (with --devices > 0; `XLA_FLAGS` gives the
  CPU as that many devices): the dispatch also calls a jitted function of the batch, and the
  step ends with `jax.block_until_ready` of its result; the batch is a pre-made jax batch, a
  numpy batch `jax.device_put` each step (what any loop pays to send a fresh host batch), or the
  iterator's with `sharding=`.

Rounds interleave the cases, so the host's drift falls on all alike. Per case: median and mean
step, their excess over the case's floor (`numpy`, or `device_resident` with sharding), the
dispatch's own time (GIL contention slows it), time in `next()` when the batch was already
prefetched (`it.ready()` before the call), and CPU of the process's other threads per step
(`/proc/self/task/*/schedstat`: the client's fetch thread, gRPC's threads), by thread.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from input_server.data import builtin_corpora
from input_server.testing.processes import cli_argv
from input_server.testing.results import emit_json


@contextlib.contextmanager
def sidecar(folder: str, data_root: str) -> Iterator[str]:
    """`input-server serve` on a Unix socket in `folder`: its target while it runs."""
    sock = f"unix://{folder}/s.sock"
    argv = [*cli_argv("serve"), "--listen", sock, "--data-root", data_root, "--tune-cache", "off"]
    log = open(os.path.join(folder, "serve.log"), "w")  # noqa: SIM115 - closed below
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, cwd=folder)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in p.stdout], daemon=True).start()
    try:
        if "serving on" not in lines.get(timeout=120):
            raise RuntimeError("the server did not start; see serve.log")
        yield sock
    finally:
        p.terminate()
        p.wait(30)
        log.close()


def thread_cpu_ns() -> dict[int, int]:
    """Each thread of this process: nanoseconds it has run on a CPU, by thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/schedstat") as f:
            out[int(tid)] = int(f.read().split()[0])
    return out


def thread_names() -> dict[int, str]:
    """Thread ids to names: Python's names, else the kernel's (`comm`: gRPC's, XLA's)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) not in names:
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
    return names


def busy(n: int) -> int:
    """Pure Python that holds the GIL (a stand-in for a step's dispatch)."""
    total = 0
    for i in range(n):
        total += i & 7
    return total


def calibrate(ms: float) -> int:
    """The `busy` count that takes `ms` on this host, alone."""
    n = 10_000
    while True:
        start = time.perf_counter()
        busy(n)
        took = time.perf_counter() - start
        if took > 0.02:
            return max(1, int(n * ms / 1e3 / took))
        n *= 2


class Case:
    """One way of feeding the loop: `take()` the batch; `step(batch)` dispatches (and returns
    what to block on, or None); `ready()` whether the batch is already there."""

    def __init__(
        self,
        name: str,
        take: Callable[[], Any],
        step: Callable[[Any], Any] | None = None,
        ready: Callable[[], bool] | None = None,
    ):
        self.name, self.take, self.step, self.ready = name, take, step, ready
        self.records: list[tuple[float, float, float, bool]] = []
        self.cpu: collections.Counter = collections.Counter()
        self.main_cpu_s = 0.0


def run_steps(case: Case, steps: int, n_busy: int, device_s: float) -> None:
    """`steps` loop steps of `case`, recorded; other threads' CPU counted over them."""
    main = threading.get_native_id()
    before, main_before = thread_cpu_ns(), time.thread_time()
    for _ in range(steps):
        was_ready = case.ready() if case.ready is not None else True
        t0 = time.perf_counter()
        batch = case.take()
        t1 = time.perf_counter()
        out = case.step(batch) if case.step is not None else None
        busy(n_busy)
        t2 = time.perf_counter()
        time.sleep(device_s)
        if out is not None:
            import jax

            jax.block_until_ready(out)
        t3 = time.perf_counter()
        case.records.append((t3 - t0, t1 - t0, t2 - t1, was_ready))
    case.main_cpu_s += time.thread_time() - main_before
    after = thread_cpu_ns()
    for tid, ns in after.items():
        if tid != main:
            case.cpu[tid] += ns - before.get(tid, 0)


def summarize(case: Case, floor: Case, names: dict[int, str]) -> dict[str, Any]:
    step = [r[0] for r in case.records]
    base = [r[0] for r in floor.records]
    ready_waits = [r[1] for r in case.records if r[3]]
    n = len(case.records)
    by_thread: collections.Counter = collections.Counter()
    for tid, ns in case.cpu.items():
        by_thread[names.get(tid, f"tid {tid}")] += ns
    us = 1e6
    return {
        "steps": n,
        "step_median_ms": statistics.median(step) * 1e3,
        "step_mean_ms": statistics.fmean(step) * 1e3,
        "excess_median_ms": (statistics.median(step) - statistics.median(base)) * 1e3,
        "excess_mean_ms": (statistics.fmean(step) - statistics.fmean(base)) * 1e3,
        "next_mean_us": statistics.fmean(r[1] for r in case.records) * us,
        "next_when_prefetched_median_us": statistics.median(ready_waits) * us
        if ready_waits
        else None,
        "prefetched_fraction": len(ready_waits) / n,
        "dispatch_mean_us": statistics.fmean(r[2] for r in case.records) * us,
        "loop_thread_cpu_us_per_step": case.main_cpu_s / n * us,
        "other_threads_cpu_us_per_step": sum(case.cpu.values()) / n / 1e3,
        "other_threads_cpu_us_per_step_by_thread": {
            k: round(v / n / 1e3, 1) for k, v in by_thread.most_common() if v / n / 1e3 >= 1
        },
    }


def placed_cases(premade: dict, devices: int) -> tuple[list[Case], Any, Any]:
    """The two cases of jax placement without the server, on a mesh of `devices` CPU devices
    along the batch; with the jitted step and the sharding, for the server's case."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    fn = jax.jit(lambda b: sum(x[0, 0] for x in b.values()))
    resident = jax.device_put(premade, sharding)
    jax.block_until_ready(fn(resident))
    cases = [
        Case("device_resident", lambda: resident, fn),
        Case("host_put", lambda: premade, lambda b: fn(jax.device_put(b, sharding))),
    ]
    return cases, fn, sharding


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100, help="steps per case per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--dispatch-ms", type=float, default=1.0)
    ap.add_argument("--device-ms", type=float, default=40.0)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--devices", type=int, default=8, help="CPU jax devices; 0: no jax cases")
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args()
    if args.devices:
        flag = f"--xla_force_host_platform_device_count={args.devices}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from input_client import InputClient, PipelineSpec

    text, model = builtin_corpora.ensure_demo_assets()
    spec = PipelineSpec(
        source={"paths": [text]},
        tokenizer={"model": model},
        batch={"seq_len": args.seq_len, "size": args.size},
        order={"epochs": 0},
    )
    n_busy = calibrate(args.dispatch_ms)
    with (
        tempfile.TemporaryDirectory() as tmp,
        sidecar(tmp, os.path.dirname(text)) as target,
        InputClient(target) as client,
        client.batches(spec, prefetch=args.prefetch) as it,
    ):
        premade = {k: np.array(v) for k, v in next(it).items()}
        cases = [Case("numpy", lambda: premade), Case("server", lambda: next(it), None, it.ready)]
        stack = contextlib.ExitStack()
        if args.devices:
            placed, fn, sharding = placed_cases(premade, args.devices)
            it_sh = stack.enter_context(
                client.batches(spec, prefetch=args.prefetch, sharding=sharding)
            )
            cases += [*placed, Case("server_sharding", lambda: next(it_sh), fn, it_sh.ready)]
        with stack:
            for c in cases:  # warm-up: compiles, first batches, the server's workers
                run_steps(c, 20, n_busy, args.device_ms / 1e3)
                c.records.clear()
                c.cpu.clear()
                c.main_cpu_s = 0.0
            for _ in range(args.rounds):
                for c in cases:
                    run_steps(c, args.steps, n_busy, args.device_ms / 1e3)
            names = thread_names()
    floors = {"numpy": cases[0], "server": cases[0]}
    if args.devices:
        floors.update(dict.fromkeys(("device_resident", "host_put", "server_sharding"), cases[2]))
    result = {
        "args": vars(args),
        "host_cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "cases": {c.name: summarize(c, floors[c.name], names) for c in cases},
    }
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
