"""`input-server demo`, the embedded default, run as a user runs it: offline, no arguments."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_command_trains_through_the_server_and_loss_goes_down(tmp_path):
    # A fresh cache: the demo must build its corpus and tokenizer from local text by itself.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-m", "input_server.cli", "demo"], capture_output=True,
                         text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "cache" / "input-server").is_dir()
    report = out.stdout
    assert "steps timed           49 (1 excluded)" in report
    assert "input-bound fraction" in report and "tokens/s" in report
    assert "worker processes" in report
    assert "(down)" in report
