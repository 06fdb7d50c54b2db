"""`input-server demo`, the embedded default, run as a user runs it: offline, no arguments."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.support import cli_argv


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """A cache the option tests share (the first run builds the corpus and tokenizer)."""
    return tmp_path_factory.mktemp("cache")


def demo(cache_home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    env.pop("XLA_FLAGS", None)
    return subprocess.run(
        cli_argv("demo", *args),
        cwd=cache_home,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_demo_command_trains_through_the_server_and_loss_goes_down(tmp_path):
    # A fresh cache: the demo must build its corpus and tokenizer from local text by itself.
    out = demo(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "input-server").is_dir()
    report = out.stdout
    assert re.search(r"steps timed +49 \(1 excluded\)", report), report
    assert "input-bound fraction" in report and "tokens/s" in report
    assert "worker processes" in report
    assert "(down)" in report


def test_demo_options_set_steps_and_shape(cache_home):
    records = cache_home / "steps.jsonl"
    out = demo(
        cache_home, "--steps", "12", "--batch-size", "4", "--seq-len", "64", "--no-progress",
        "--records", str(records),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"steps timed +11 \(1 excluded\)", out.stdout), out.stdout
    assert "[demo" not in out.stderr  # no progress lines
    # Each step's record, as `plot-steps` reads it: every step once, its tokens the batch's.
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(12))
    assert all(r["num_tokens"] == 4 * 64 and r["data_wait_s"] >= 0 for r in rows), rows[:2]


def test_demo_says_a_records_file_it_cannot_write_before_it_runs(tmp_path):
    out = demo(tmp_path, "--records", str(tmp_path / "no" / "such" / "steps.jsonl"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("input-server: ") and "steps.jsonl" in out.stderr, out.stderr
    assert not (tmp_path / "input-server").exists()  # nothing was built


@pytest.mark.parametrize(
    "flag, value, least", [("--steps", "1", 2), ("--seq-len", "0", 1), ("--batch-size", "-3", 1)]
)
def test_demo_refuses_sizes_it_cannot_run(tmp_path, flag, value, least):
    out = demo(tmp_path, flag, value)
    assert out.returncode == 2
    assert f"argument {flag}: must be an integer of at least {least}, got {value}" in out.stderr
