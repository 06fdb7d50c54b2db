"""`input-server plot-steps`: a real StepTimer's records drawn into a valid PNG, the first step
apart and the stall visible, runs appended to one file drawn apart; a file that is not one is
one line, exit 2."""

from __future__ import annotations

import json
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


@pytest.fixture
def figures(monkeypatch):
    """The figures plot-steps draws, kept open for inspection instead of closed."""
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    return kept


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """`input-server ARGS` in this process: its exit code, stdout and stderr."""
    from input_server import cli

    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _timed_run(path, steps: int, *, run_id=None, sleep_after_s: float = 0.0) -> StepTimer:
    """A real StepTimer appending `steps` jitted steps to `path`, the loop sleeping after each."""
    timer = StepTimer(tokens_per_step=8, records_path=path, run_id=run_id)
    step = jax.jit(lambda x: jnp.tanh(x) * 2)
    for _ in range(steps):
        timer.step(step, jnp.ones((8,)))
        time.sleep(sleep_after_s)
    return timer


def _lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


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
        pytest.param(
            '{"run": 3, "index": 0, "step_s": 1, "data_wait_s": 0}\n', ["`run`"], id="run-not-str"
        ),
        pytest.param(
            '{"index": 0, "step_s": 1, "data_wait_s": 0, "process": 0, "worst_process": 1}\n',
            ["line 1", "pod line without `worst_data_wait_s`, `worst_step_s`"],
            id="pod-line-half",
        ),
        pytest.param(
            '{"index": 0, "step_s": 1, "data_wait_s": 0, "process": 0, "worst_process": -1, '
            '"worst_data_wait_s": 0, "worst_step_s": 1}\n',
            ["`worst_process`", "process index"],
            id="pod-process-negative",
        ),
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


def test_two_runs_in_one_file_are_drawn_in_two_labelled_panels(tmp_path, capsys, figures):
    """Each run's steps count from 0: on one axis they fell on each other."""
    path = tmp_path / "steps.jsonl"
    first = _timed_run(path, 6)
    _timed_run(path, 4, run_id="slow-loop", sleep_after_s=0.05)
    out = tmp_path / "steps.png"
    code, stdout, err = _main(capsys, "plot-steps", str(path), "-o", str(out))
    assert (code, err) == (0, "")
    assert _png_size(out) == (800, 800)  # two 400-pixel panels

    top, bottom = figures[0].axes
    assert top.get_title() == f"run 1: {first.run_id}"
    assert bottom.get_title() == "run 2: slow-loop"
    assert figures[0].get_suptitle().replace("\n", "") == str(path)  # wrapped if long
    assert list(_lines(top)["data wait s"].get_xdata()) == [1, 2, 3, 4, 5]
    assert list(_lines(bottom)["data wait s"].get_xdata()) == [1, 2, 3]
    # The second loop slept after each step: its step-to-step real time shows it.
    wall = _lines(bottom)["step to step (wall clock) s"].get_ydata()
    assert min(wall) >= 0.05
    device = _lines(bottom)["step (device) s"].get_ydata()
    assert all(w > d for w, d in zip(wall, device, strict=True))
    assert stdout.splitlines() == [
        f"{path}: 2 runs",
        f"  run 1: {first.run_id}  6 steps  (panel 1)",
        "  run 2: slow-loop  4 steps  (panel 2)",
    ]


@pytest.mark.parametrize("wanted", ["slow-loop", "2", "-1"], ids=["by-id", "by-number", "last"])
def test_run_draws_the_one_run_it_names(tmp_path, capsys, figures, wanted):
    path = tmp_path / "steps.jsonl"
    first = _timed_run(path, 6)
    _timed_run(path, 4, run_id="slow-loop")
    out = tmp_path / "steps.png"
    code, stdout, err = _main(capsys, "plot-steps", str(path), "-o", str(out), "--run", wanted)
    assert (code, err) == (0, "")
    (ax,) = figures[0].axes
    assert ax.get_title() == "run 2: slow-loop"
    assert list(_lines(ax)["step (device) s"].get_xdata()) == [1, 2, 3]
    assert f"run 1: {first.run_id}  6 steps  (not drawn: --run 1)" in stdout


def test_a_run_the_file_does_not_hold_is_one_line_naming_its_runs(tmp_path, capsys):
    path = tmp_path / "steps.jsonl"
    _timed_run(path, 2, run_id="a")
    _timed_run(path, 2, run_id="b")
    out = tmp_path / "o.png"
    for wanted in ("c", "3", "-3", "0"):
        code, err = run_main(capsys, "plot-steps", str(path), "-o", str(out), "--run", wanted)
        assert_one_line(code, err, f"no run {wanted!r}", "run 1: a, run 2: b")
    assert not out.exists()


def test_an_older_file_without_run_ids_is_split_where_the_index_starts_again(
    tmp_path, capsys, figures
):
    """Files written before StepTimer named its runs stay readable, their runs apart."""
    path = tmp_path / "old.jsonl"
    lines = [{"index": i, "name": "train", "step_s": 0.1, "data_wait_s": 0.0} for i in range(4)] + [
        {"index": i, "name": "train", "step_s": 0.2, "data_wait_s": 0.0} for i in range(3)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, stdout, err = _main(capsys, "plot-steps", str(path), "-o", str(tmp_path / "o.png"))
    assert (code, err) == (0, "")
    titles = [ax.get_title() for ax in figures[0].axes]
    assert titles == ["run 1 (no id)", "run 2 (no id)"]
    assert list(_lines(figures[0].axes[1])["step (device) s"].get_ydata()) == [0.2, 0.2]
    assert "step to step (wall clock) s" not in _lines(figures[0].axes[0])  # not recorded


def test_many_runs_draw_the_last_ones_and_list_the_rest(tmp_path, capsys, figures):
    from input_server.cli.plot_steps import MAX_PANELS

    path = tmp_path / "steps.jsonl"
    for n in range(MAX_PANELS + 2):
        _timed_run(path, 2, run_id=f"r{n}")
    code, stdout, err = _main(capsys, "plot-steps", str(path), "-o", str(tmp_path / "o.png"))
    assert (code, err) == (0, "")
    assert [ax.get_title() for ax in figures[0].axes] == [
        f"run {n + 1}: r{n}" for n in range(2, MAX_PANELS + 2)
    ]
    assert "run 1: r0  2 steps  (not drawn: --run 1)" in stdout


# A pod line's worst host: (worst_process, worst_data_wait_s) a step, its step 0.1 s. A wait of
# 0.001 s is 1 % of wait plus step, 0.01 s 9 % (input-bound), 0.05 s 33 % (highly).
POD = [(0, 0.2), (0, 0.001), (2, 0.01), (2, 0.05), (2, 0.05), (1, 0.001)]
POD += [(0, 0.01), (2, 0.01), (1, 0.05), (0, 0.001), (0, 0.001), (0, 0.001)]


def _pod_file(path) -> list[dict]:
    """Process 0's lines of a three-process run, as StepTimer writes them on a pod: its own
    wait (0.001 s, or the worst's when it was the worst) beside the worst host's."""
    lines = []
    for i, (worst, wait) in enumerate(POD):
        lines.append(
            {
                "run": "pod-run",
                "index": i,
                "name": "compile" if i == 0 else "train",
                "step_s": 0.1,
                "data_wait_s": wait if worst == 0 else 0.001,
                "wall_s": 0.11,
                "process": 0,
                "worst_process": worst,
                "worst_data_wait_s": wait,
                "worst_step_s": 0.1,
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def _band_spans(ax, gid: str) -> list[tuple[float, float]]:
    """The x extent of each band drawn with `gid` (axvspan: a Rectangle or a Polygon)."""
    spans = []
    for patch in ax.patches:
        if patch.get_gid() == gid:
            xs = patch.get_patch_transform().transform(patch.get_path().vertices)[:, 0]
            spans.append((float(min(xs)), float(max(xs))))
    return sorted(spans)


def test_a_pod_run_draws_the_worst_host_beside_this_one(tmp_path, capsys, figures):
    path = tmp_path / "pod.jsonl"
    lines = _pod_file(path)
    code, stdout, err = _main(capsys, "plot-steps", str(path), "-o", str(tmp_path / "p.png"))
    assert (code, err) == (0, "")
    (ax,) = figures[0].axes
    drawn = _lines(ax)
    worst = drawn["worst host's data wait s"]
    assert list(worst.get_xdata()) == list(range(1, 12))  # the first step apart, as the others
    assert list(worst.get_ydata()) == [w for _, w in POD[1:]]
    assert list(drawn["data wait s"].get_ydata()) == [r["data_wait_s"] for r in lines[1:]]
    # Marked where another process was the worst host, on the worst host's line.
    other = drawn["another host was worst"]
    assert list(other.get_xdata()) == [2, 3, 4, 5, 7, 8]
    assert list(other.get_ydata()) == [0.01, 0.05, 0.05, 0.001, 0.01, 0.05]
    # Bands over consecutive steps whose worst host waited over 5 % and 20 % of wait + step.
    assert _band_spans(ax, "input-bound") == [(1.5, 4.5), (5.5, 8.5)]
    assert _band_spans(ax, "highly-input-bound") == [(2.5, 4.5), (7.5, 8.5)]
    assert ax.get_ylim()[1] >= 0.05  # the worst waits on the scale
    # Input-bound steps 2, 3, 4, 6, 7, 8: process 2 was worst on 4 of them.
    label = "process 0; worst host process 2 (4 of 6 input-bound steps)"
    assert ax.get_title() == f"run 1: pod-run\n{label}"
    # The first step's worst host, its process named.
    assert any("the worst host's wait: process 0, 0.2 s" in t.get_text() for t in ax.texts)
    assert stdout.splitlines()[1] == f"  run 1: pod-run  12 steps  (panel 1); {label}"


def test_a_pod_run_no_step_input_bound_names_the_host_worst_most_often(tmp_path, capsys, figures):
    path = tmp_path / "pod.jsonl"
    _pod_file(path)
    fed = [{**json.loads(x), "worst_data_wait_s": 0.001} for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(x) + "\n" for x in fed))
    code, _, err = _main(capsys, "plot-steps", str(path), "-o", str(tmp_path / "p.png"))
    assert (code, err) == (0, "")
    (ax,) = figures[0].axes
    assert ax.get_title().endswith(
        "process 0; worst host process 0 (5 of 11 steps, none input-bound)"
    )
    assert _band_spans(ax, "input-bound") == _band_spans(ax, "highly-input-bound") == []


def test_a_one_process_run_draws_no_pod_lines(records, tmp_path, capsys, figures):
    code, _, err = _main(capsys, "plot-steps", str(records), "-o", str(tmp_path / "p.png"))
    assert (code, err) == (0, "")
    (ax,) = figures[0].axes
    assert set(_lines(ax)) == {"step (device) s", "data wait s", "step to step (wall clock) s"}
    assert [p.get_gid() for p in ax.patches if p.get_gid()] == []
    assert "process" not in ax.get_title()


def test_a_pod_runs_titles_fit_the_figure(tmp_path, capsys, figures):
    """A pod run's panel names its run and the worst host beside it: on one line it ran off
    the figure's right edge, as a long file name did above it. Each is wrapped to fit."""
    from input_client.step_record import new_run_id

    run_id = new_run_id()
    lines = []
    for i in range(1500):
        bound = i % 3 == 1  # the host of the highest index worst and input-bound, often
        lines.append(
            {
                "run": run_id,
                "index": i,
                "step_s": 0.1,
                "data_wait_s": 0.001,
                "process": 12,
                "worst_process": 127 if bound else 12,
                "worst_data_wait_s": 0.05 if bound else 0.001,
                "worst_step_s": 0.1,
            }
        )
    folder = tmp_path / "an-experiment-folder-with-a-long-name" / "and-another-below-it"
    folder.mkdir(parents=True)
    path = folder / "steps-of-the-pod.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _, err = _main(capsys, "plot-steps", str(path), "-o", str(tmp_path / "p.png"))
    assert (code, err) == (0, "")
    fig = figures[0]
    (ax,) = fig.axes
    label = "process 12; worst host process 127 (500 of 500 input-bound steps)"
    assert ax.get_title() == f"run 1: {run_id}\n{label}"
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (suptitle,) = fig.texts
    for text in (ax.title, suptitle):
        box = text.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1, (text.get_text(), box)
