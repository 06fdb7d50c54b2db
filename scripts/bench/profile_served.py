"""Where a served stream's CPU goes: each spec through a real `serve` process over a Unix socket,
read unthrottled (or at `--pace` batches a second: a train step's demand) for a while, with its
rate, the CPU of the server and its worker processes a token and each second, the parallelism
and backend it served with, and (with --py-spy) py-spy's samples of the server and its workers,
folded, for reading with any flame-graph tool or `sort | head`.

    python3 scripts/bench/profile_served.py A.toml B.toml [--seconds 10] [--warm-s 3] [--pace 25]
        [--py-spy DIR] [--serve-flags "--tokenizer-audit-every 0"]

Prints one JSON line a spec. Works where TCP does not (the TPU host): Unix sockets only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

from input_client import InputClient
from input_client.spec import PipelineSpec


def _tree_cpu(process: psutil.Process) -> float:
    """CPU seconds of `process` and its living children (Grain's worker processes)."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def _spy(pid: int, out: str, seconds: float) -> subprocess.Popen:
    """py-spy recording `pid` and its worker processes into `out` (folded) for `seconds`."""
    argv = ["py-spy", "record", "--pid", str(pid), "--subprocesses", "--format", "raw"]
    argv += ["--rate", "200", "--duration", str(int(seconds)), "--output", out, "--nonblocking"]
    with open(f"{out}.log", "w") as log:  # the child keeps its own copy
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)


def _read(it, process, seconds: float, pace: float) -> dict:
    """Reads `it` for `seconds` (at `pace` batches a second when > 0: a train step's demand),
    with the server tree's cores each second of it."""
    cpu, t0, tokens, batches, client_cpu = _tree_cpu(process), time.perf_counter(), 0, 0, 0.0
    client0, timeline, mark, mark_cpu = time.process_time(), [], t0, cpu
    while (now := time.perf_counter()) - t0 < seconds:
        if pace > 0 and batches > (now - t0) * pace:
            time.sleep(min(0.05, batches / pace - (now - t0)))
            continue
        tokens += int(np.count_nonzero(next(it)["inputs_segmentation"]))
        batches += 1
        if now - mark >= 1.0:
            at_cpu = _tree_cpu(process)
            timeline.append(round((at_cpu - mark_cpu) / (now - mark), 2))
            mark, mark_cpu = now, at_cpu
    elapsed = time.perf_counter() - t0
    cpu, client_cpu = _tree_cpu(process) - cpu, time.process_time() - client0
    return {
        "tokens_per_s": tokens / elapsed,
        "batches_per_s": batches / elapsed,
        "server_cores": cpu / elapsed,
        "server_cpu_ns_per_token": 1e9 * cpu / max(1, tokens),
        "client_cpu_ns_per_token": 1e9 * client_cpu / max(1, tokens),
        "server_cores_each_s": timeline,
    }


def profile(
    path: str,
    seconds: float,
    warm_s: float,
    py_spy: str | None,
    pace: float,
    flags: list[str],
    prefetch: int = 2,
    sample: str | None = None,
    switch_ms: float | None = None,
) -> dict:
    spec = PipelineSpec.from_toml(path)
    name = os.path.splitext(os.path.basename(path))[0]
    roots = {
        os.path.dirname(os.path.abspath(p))
        for p in (*(q for s in spec.sources for q in s.paths), spec.tokenizer.model)
        if p
    }
    with tempfile.TemporaryDirectory(prefix="prof-") as tmp:
        target = f"unix://{tmp}/s.sock"
        argv = [sys.executable, "-m", "input_server.cli", "serve", "--listen", target]
        if sample:  # the server under scripts/bench/sampled.py, whose stacks py-spy cannot reach
            out = os.path.join(sample, f"{name}.folded")
            argv[1:1] = [os.path.join(os.path.dirname(__file__), "sampled.py"), "--out", out]
            if switch_ms:
                argv[2:2] = ["--switch-interval-ms", str(switch_ms)]
        argv += [a for r in sorted(roots) for a in ("--data-root", r)]
        argv += ["--tune-cache", "off", *flags]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        try:
            with (
                InputClient(target, connect_timeout_s=60) as client,
                client.batches(spec, prefetch=prefetch) as it,
            ):
                start = time.perf_counter()
                while time.perf_counter() - start < warm_s:
                    next(it)
                process = psutil.Process(server.pid)
                spy = (
                    _spy(server.pid, os.path.join(py_spy, f"{name}.folded"), seconds)
                    if py_spy
                    else None
                )
                read = _read(it, process, seconds, pace)
                s = max(client.info().streams, key=lambda x: x.stream_id)
                if spy is not None:
                    spy.wait(seconds + 30)
        finally:
            server.terminate()
            server.wait(30)
    return {
        "spec": name,
        "serve_flags": " ".join(flags),
        "prefetch": prefetch,
        "switch_interval_ms": switch_ms,
        **read,
        "processes": s.worker_processes,
        "threads": s.worker_threads,
        "backend": s.tokenizer_backend,
        "backend_why": s.tokenizer_backend_why[-300:],
        "worker_reason": s.worker_reason[-400:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warm-s", type=float, default=3.0)
    parser.add_argument("--py-spy", metavar="DIR", help="record py-spy's samples into DIR")
    parser.add_argument(
        "--pace", type=float, default=0.0, help="batches a second to read (0: all it serves)"
    )
    parser.add_argument(
        "--serve-flags", default="", help="more `serve` flags, e.g. '--tokenizer-audit-every 0'"
    )
    parser.add_argument(
        "--sample", metavar="DIR", help="the server's stacks by scripts/bench/sampled.py into DIR"
    )
    parser.add_argument(
        "--switch-interval-ms", type=float, help="with --sample: the server's GIL switch interval"
    )
    parser.add_argument("--prefetch", type=int, default=2, help="the client's `batches(prefetch=)`")
    args = parser.parse_args()
    if args.switch_interval_ms and not args.sample:
        parser.error("--switch-interval-ms sets the server's switch interval through --sample")
    for folder in (args.sample, args.py_spy):
        if folder:
            os.makedirs(folder, exist_ok=True)
    for path in args.specs:
        try:
            print(
                json.dumps(
                    profile(
                        path,
                        args.seconds,
                        args.warm_s,
                        args.py_spy,
                        args.pace,
                        shlex.split(args.serve_flags),
                        args.prefetch,
                        args.sample,
                        args.switch_interval_ms,
                    )
                ),
                flush=True,
            )
        except Exception as e:  # noqa: BLE001 - one spec's failure is its line, the rest go on
            print(json.dumps({"spec": path, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
