"""`input-server plot-steps`: a real StepTimer's records drawn into a valid PNG, the first step
apart and the stall visible; a file that is not one is one line, exit 2."""

from __future__ import annotations

import struct
import sys
import time

import jax
import jax.numpy as jnp
import matplotlib
import pytest

from input_client import StepTimer
from tests.support import assert_one_line, run_main

matplotlib.use("Agg")


class StallingBatches:
    """A data iterator that blocks `stall_s` at batch `at` and not otherwise, counting its
    waits as the client's iterator does (a server that stalled once)."""

    def __init__(self, at: int, stall_s: float):
        self.at, self.stall_s, self.taken = at, stall_s, 0
        self.wait_time_s = 0.0

    def __next__(self):
        start = time.perf_counter()
        if self.taken == self.at:
            time.sleep(self.stall_s)
        self.taken += 1
        self.wait_time_s += time.perf_counter() - start
        return jnp.ones((8,))


@pytest.fixture
def records(tmp_path):
    """A records file a real StepTimer wrote over 12 jitted steps, step 6's data stalled."""
    path = tmp_path / "steps.jsonl"
    batches = StallingBatches(at=6, stall_s=0.3)
    timer = StepTimer(tokens_per_step=8, data_source=batches, records_path=path)
    step = jax.jit(lambda x: jnp.tanh(x) * 2)
    for _ in range(12):
        timer.step(step, next(batches))
    return path


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_steps_draws_a_png_with_the_stall_and_the_first_step_apart(
    records, tmp_path, capsys, monkeypatch
):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # kept open for inspection
    out = tmp_path / "steps.png"
    code, err = run_main(capsys, "plot-steps", str(records), "-o", str(out))
    assert (code, err) == (0, "")
    width, height = _png_size(out)
    assert (width, height) == (800, 400)
    assert 10_000 < out.stat().st_size < 1_000_000

    ax = figures[0].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    wait = lines["data wait s"]
    assert list(wait.get_xdata()) == list(range(1, 12))  # the first step is not on the lines
    waits = list(wait.get_ydata())
    assert max(waits) == waits[5] >= 0.3  # step 6's stall, the highest point
    assert ax.get_ylim()[1] >= waits[5]  # on the scale, not clipped
    assert any(t.get_text().startswith(" first step (compile)") for t in ax.texts)


def test_only_one_record_still_draws(tmp_path, capsys):
    path = tmp_path / "one.jsonl"
    StepTimer(records_path=path).step(jax.jit(lambda x: x + 1), jnp.ones(2))
    out = tmp_path / "one.png"
    assert run_main(capsys, "plot-steps", str(path), "-o", str(out)) == (0, "")
    _png_size(out)


@pytest.mark.parametrize(
    "content, needles",
    [
        pytest.param(None, ["no file", "records_path"], id="missing-file"),
        pytest.param("", ["holds no step records"], id="empty"),
        pytest.param(
            '{"index": 0, "step_s": 1.0, "data_wait_s": 0}\n{oops\n', ["line 2"], id="bad-json"
        ),
        pytest.param("[1, 2]\n", ["line 1", "not a JSON object"], id="not-an-object"),
        pytest.param('{"index": 0, "data_wait_s": 0}\n', ["line 1", "`step_s`"], id="no-step-s"),
        pytest.param('{"index": 0, "step_s": -1, "data_wait_s": 0}\n', ["`step_s`"], id="negative"),
    ],
)
def test_a_file_that_is_not_records_is_one_line(tmp_path, capsys, content, needles):
    path = tmp_path / "steps.jsonl"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "out.png"
    code, err = run_main(capsys, "plot-steps", str(path), "-o", str(out))
    assert_one_line(code, err, *needles)
    assert not out.exists()


def test_without_matplotlib_it_says_so_in_one_line(records, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an environment without it
    code, err = run_main(capsys, "plot-steps", str(records), "-o", str(tmp_path / "o.png"))
    assert_one_line(code, err, "pip install matplotlib")
