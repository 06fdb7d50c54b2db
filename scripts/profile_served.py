"""Where a served stream's CPU goes: each spec through a real `serve` process over a Unix socket,
read unthrottled for a while, with its rate, the CPU of the server and its worker processes a
token, the parallelism and backend it served with, and (with --py-spy) py-spy's samples of the
server and its workers, folded, for reading with any flame-graph tool or `sort | head`.

    python3 scripts/profile_served.py A.toml B.toml [--seconds 10] [--warm-s 3] [--py-spy DIR]

Prints one JSON line a spec. Works where TCP does not (the TPU host): Unix sockets only.
"""

from __future__ import annotations

import argparse
import json
import os
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


def profile(path: str, seconds: float, warm_s: float, py_spy: str | None) -> dict:
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
        argv += [a for r in sorted(roots) for a in ("--data-root", r)]
        argv += ["--tune-cache", "off"]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        try:
            with (
                InputClient(target, connect_timeout_s=60) as client,
                client.batches(spec, prefetch=2) as it,
            ):
                start = time.perf_counter()
                while time.perf_counter() - start < warm_s:
                    next(it)
                process = psutil.Process(server.pid)
                spy = None
                if py_spy:
                    out = os.path.join(py_spy, f"{name}.folded")
                    spy = subprocess.Popen(
                        [
                            "py-spy",
                            "record",
                            "--pid",
                            str(server.pid),
                            "--subprocesses",
                            "--format",
                            "raw",
                            "--rate",
                            "200",
                            "--duration",
                            str(int(seconds)),
                            "--output",
                            out,
                            "--nonblocking",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=open(f"{out}.log", "w"),  # noqa: SIM115 - the child's to close
                    )
                cpu, t0, tokens = _tree_cpu(process), time.perf_counter(), 0
                client_cpu = time.process_time()
                while time.perf_counter() - t0 < seconds:
                    tokens += int(np.count_nonzero(next(it)["inputs_segmentation"]))
                elapsed = time.perf_counter() - t0
                cpu, client_cpu = _tree_cpu(process) - cpu, time.process_time() - client_cpu
                s = max(client.info().streams, key=lambda x: x.stream_id)
                if spy is not None:
                    spy.wait(seconds + 30)
        finally:
            server.terminate()
            server.wait(30)
    return {
        "spec": name,
        "tokens_per_s": tokens / elapsed,
        "server_cores": cpu / elapsed,
        "server_cpu_ns_per_token": 1e9 * cpu / max(1, tokens),
        "client_cpu_ns_per_token": 1e9 * client_cpu / max(1, tokens),
        "processes": s.worker_processes,
        "threads": s.worker_threads,
        "backend": s.tokenizer_backend,
        "backend_why": s.tokenizer_backend_why[-300:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warm-s", type=float, default=3.0)
    parser.add_argument("--py-spy", metavar="DIR", help="record py-spy's samples into DIR")
    args = parser.parse_args()
    for path in args.specs:
        try:
            print(json.dumps(profile(path, args.seconds, args.warm_s, args.py_spy)), flush=True)
        except Exception as e:  # noqa: BLE001 - one spec's failure is its line, the rest go on
            print(json.dumps({"spec": path, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
