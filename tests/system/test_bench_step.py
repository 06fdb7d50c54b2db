"""scripts/bench/bench_step.py, the train-step benchmark made for the TPU host, runs on CPU at toy
sizes and reports every feed's figures (speed itself is not asserted: the benchmark measures
it; docs/benchmarks.md "On a TPU host" holds the accelerator's figures)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from input_server.testing.processes import TREE

FEEDS = ("device", "host", "server", "server_sharded", "grain_1", "grain_auto")


def test_bench_step_reports_each_feed_the_start_and_the_restart(tmp_path):
    out = tmp_path / "step.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    run = subprocess.run(
        [
            sys.executable, os.path.join(TREE, "scripts", "bench", "bench_step.py"),
            "--sizes", "64x1", "--batch", "4", "--seq-len", "128", "--steps", "6",
            "--warmup", "1", "--loss-chunk", "128", "--host-batches", "3",
            "--feeds", ",".join(FEEDS), "--restart-steps", "400", "--out", str(out),
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(run.stdout) == result
    assert result["devices"].endswith("(cpu)") and result["tokenizer"]["vocab"] > 100
    start = result["server_start"]
    assert 0 < start["listening_s"] <= start["first_batch_cold_s"]
    assert start["next_stream_first_s"] > 0
    (model,) = result["models"]
    assert model["size"] == "64x1" and model["params"] > 0
    feeds = model["feeds"]
    assert set(feeds) == set(FEEDS)
    for name, f in feeds.items():
        assert 0 < f["median_ms"] <= f["p90_ms"], name
        assert 0 <= f["wait_share"] < 1 and f["trainer_tree_cores"] > 0, name
        assert math.isfinite(f["last_loss"]) and f["x_device"] > 0, name
        # The server's process tree is counted for the server's feeds alone.
        assert (f["server_tree_cores"] is not None) == name.startswith("server"), name
    assert feeds["device"]["x_device"] == 1.0
    assert feeds["grain_1"]["grain_workers"] == 1 and feeds["grain_auto"]["grain_workers"] >= 1
    restart = result["restart"]
    # The kill and restart cost the loop a wait (the server's start), and the stream went on.
    assert restart["stall_s"] > 0.1 and restart["kill_to_next_batch_s"] >= restart["stall_s"]
