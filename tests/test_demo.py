"""`input-server demo`, the embedded default, run as a user runs it: offline, no arguments."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    # A fresh cache: the demo must build its corpus and tokenizer from local text by itself.
    return tmp_path_factory.mktemp("cache")


def demo(cache_home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "input_server.cli", "demo", *args],
                          capture_output=True, text=True, timeout=300, env=env,
                          stdin=subprocess.DEVNULL)


def test_demo_command_trains_through_the_server_and_loss_goes_down(cache_home):
    out = demo(cache_home)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (cache_home / "input-server").is_dir()
    report = out.stdout
    assert "steps timed           49 (1 excluded)" in report
    assert "input-bound fraction" in report and "tokens/s" in report
    assert "worker processes" in report
    assert "(down)" in report


def test_demo_options_set_steps_and_shape(cache_home):
    out = demo(cache_home, "--steps", "12", "--batch-size", "4", "--seq-len", "64",
               "--no-progress")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "steps timed           11 (1 excluded)" in out.stdout
    assert "[demo" not in out.stderr and "train:" not in out.stderr  # no progress


@pytest.mark.parametrize("flag", ["--steps", "--seq-len", "--batch-size"])
def test_demo_refuses_a_size_that_is_not_positive(cache_home, flag):
    out = demo(cache_home, flag, "0")
    assert out.returncode == 2
    assert f"argument {flag}: must be a positive integer, got 0" in out.stderr
