"""Benchmark: real MaxText fed by the input server against MaxText's own Grain pipeline.

    python scripts/bench/bench_maxtext.py [--steps 60] [--rounds 1] [--out FILE.json]

One corpus (the standard library's docstrings as Parquet files, the demo's sentencepiece
model), the tiny decoder of tests/system/test_maxtext.py on this host's CPU, MaxText 0.2.5 in
its own venv (scripts/tools/maxtext_venv.sh). Each configuration is one training run:

- `server`: `input-server serve` in its own process (workers "auto"), MaxText through
  input_client.maxtext;
- `grain_0`, `grain_1`, `grain_auto`: MaxText's Grain pipeline with grain_worker_count 0, 1
  and -1 (its own pick).

Per run (scripts/bench/maxtext_runner.py times the data iterator's `next()` inside MaxText):
`steady_step_s`, the mean of MaxText's logged step seconds from step 5 on; `data_wait_s`, the
mean wait for a batch from step 5 on; `first_batch_s`, from process start to the first batch in
hand; `first_wait_s`, that first `next()` alone. Also the client-only venv (`pip install
./client` into a fresh venv): its size, and `import input_client` against a bare interpreter.
Printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from input_server.testing.maxtext import TINY_MAXTEXT  # the tiny decoder of the MaxText tests
from input_server.testing.results import emit_json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # this is scripts/bench/
TOOLS = os.path.join(ROOT, "scripts", "tools")
STEP = re.compile(r"completed step: (\d+), seconds: ([\d.]+),")

MODEL = [
    *TINY_MAXTEXT,
    "skip_jax_distributed_system=true",
    "enable_checkpointing=false",
    "eval_interval=-1",
]
STEADY_FROM = 5


def write_parquet(corpus: str, folder: str, files: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(corpus) as f:
        texts = [json.loads(line)["text"] for line in f]
    for i in range(files):
        pq.write_table(
            pa.table({"text": texts[i::files]}), os.path.join(folder, f"part-{i}.parquet")
        )
    return os.path.join(folder, "part-*.parquet")


def run_maxtext(python: str, options: dict, args: list[str]) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DECOUPLE_GCLOUD": "TRUE"}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run(
        [python, os.path.join(HERE, "maxtext_runner.py"), json.dumps(options), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if out.returncode != 0:
        sys.exit(f"MaxText failed ({options or 'grain'}):\n{out.stderr[-4000:]}")
    report = json.loads(out.stdout.split("BENCH ", 1)[1].splitlines()[0])
    steps = {int(s): float(t) for s, t in STEP.findall(out.stderr)}
    waits = report["waits"]
    steady = [steps[s] for s in sorted(steps) if s >= STEADY_FROM]
    return {
        "steady_step_s": statistics.fmean(steady),
        "data_wait_s": statistics.fmean(w for _, w in waits[STEADY_FROM:]),
        "max_wait_after_first_s": max(w for _, w in waits[1:]),
        "first_batch_s": waits[0][0] + waits[0][1],
        "first_wait_s": waits[0][1],
        "steps": len(steps),
        "wall_s": report["wall_s"],
    }


def client_venv(folder: str) -> dict:
    venv = os.path.join(folder, "client-venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    subprocess.run(
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            os.path.join(ROOT, "client"),
        ],
        check=True,
        capture_output=True,
    )
    size = int(
        subprocess.run(
            ["du", "-sk", venv], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )

    def wall(code: str) -> float:
        times = []
        for _ in range(7):
            start = time.perf_counter()
            subprocess.run([py, "-c", code], check=True)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    bare, client = wall("pass"), wall("import input_client")
    return {
        "size_mb": round(size / 1024, 1),
        "import_s": round(client - bare, 3),
        "interpreter_s": round(bare, 3),
        "packages": subprocess.run(
            [py, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
        ).stdout.split(),
    }


def _maxtext_python() -> str:
    """The Python of MaxText's own venv (made by maxtext_venv.sh once)."""
    run = subprocess.run(
        ["bash", os.path.join(TOOLS, "maxtext_venv.sh")], check=True, capture_output=True, text=True
    )
    return run.stdout.strip().splitlines()[-1]


def _serve(sock: str, roots: list[str]) -> subprocess.Popen:
    argv = [sys.executable, "-m", "input_server.cli", "serve", "--listen", f"unix://{sock}"]
    argv += [a for r in roots for a in ("--data-root", r)] + ["--tune-cache", "off"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _configs(sock: str, spec_file: str, pattern: str) -> dict[str, tuple[dict, list[str]]]:
    """Each feed's client options and extra MaxText arguments: the server, Grain at 0, 1 and
    MaxText's automatic worker count."""
    grain = {
        f"grain_{name}": (
            {},
            [
                "grain_file_type=parquet",
                f"grain_train_files={pattern}",
                f"grain_worker_count={count}",
            ],
        )
        for name, count in (("0", 0), ("1", 1), ("auto", -1))
    }
    return {"server": ({"server": f"unix://{sock}", "spec": spec_file}, []), **grain}


def _result(args, runs: dict[str, list[dict]], venv) -> dict:
    best = {name: min(r, key=lambda x: x["steady_step_s"]) for name, r in runs.items()}
    return {
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"),
        },
        "setup": {
            "steps": args.steps,
            "per_device_batch_size": args.batch,
            "max_target_length": args.seq,
            "parquet_files": args.files,
            "rounds": args.rounds,
        },
        "runs": runs,
        "steady_step_vs_grain": {
            name: round(best["server"]["steady_step_s"] / best[name]["steady_step_s"], 3)
            for name in best
            if name != "server"
        },
        "client_venv": venv,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8, help="per_device_batch_size")
    parser.add_argument("--seq", type=int, default=256, help="max_target_length")
    parser.add_argument("--files", type=int, default=8, help="Parquet files of the corpus")
    parser.add_argument("--out")
    args = parser.parse_args()

    from input_client import InputClient, PipelineSpec
    from input_server.data.builtin_corpora import ensure_demo_assets

    python = _maxtext_python()
    corpus, model = ensure_demo_assets()
    with tempfile.TemporaryDirectory(prefix="bench-maxtext-") as tmp:
        pattern = write_parquet(corpus, tmp, args.files)
        spec = PipelineSpec(
            source={"paths": [pattern], "format": "parquet"},
            tokenizer={"model": model},
            batch={"seq_len": args.seq, "size": args.batch},
            order={"epochs": 0},
        )
        spec_file = os.path.join(tmp, "spec.toml")
        with open(spec_file, "w") as f:
            f.write(spec.to_toml())
        sock = os.path.join(tmp, "input.sock")
        server = _serve(sock, [tmp, os.path.dirname(model)])
        try:
            with InputClient(f"unix://{sock}", connect_timeout_s=60) as c:
                c.wait_ready()
            common = [
                *MODEL,
                f"steps={args.steps}",
                f"tokenizer_path={model}",
                f"max_target_length={args.seq}",
                f"per_device_batch_size={args.batch}",
                "dataset_type=grain",
            ]
            configs = _configs(sock, spec_file, pattern)
            runs: dict[str, list[dict]] = {name: [] for name in configs}
            for _ in range(args.rounds):
                for name, (options, extra) in configs.items():
                    out = [f"run_name=bench-{name}", f"base_output_directory={tmp}/out", *extra]
                    runs[name].append(run_maxtext(python, options, [*common, *out]))
            venv = client_venv(tmp)
        finally:
            server.terminate()
            server.wait(timeout=30)
    emit_json(_result(args, runs, venv), args.out)


if __name__ == "__main__":
    main()
