"""The pod's figures by the worst host of each step, and the data-loading badput record: the
arithmetic on steps whose figures are given, and the timer on one process (where no collective
runs and nothing of its single-process output changes)."""

from __future__ import annotations

import json

import jax
import pytest

from input_client import timing
from input_client.badput import RECORD, BadputTally, RunBadput, append, job_badput
from input_client.pod import PodGather, PodStep, pod_summary
from input_client.timing import StepTimer


def _step(index: int, waits: tuple[float, ...], steps: tuple[float, ...], name: str = "train"):
    return PodStep(index=index, name=name, data_wait_s=waits, step_s=steps)


def test_the_worst_host_is_the_process_that_waited_longest():
    s = _step(0, (0.01, 0.30, 0.02), (1.0, 0.7, 1.0))
    assert (s.worst_process, s.worst_data_wait_s) == (1, 0.30)
    assert s.worst_fraction == pytest.approx(0.30 / (0.30 + 0.7))  # its own step beside it


def test_a_tie_names_the_lowest_process_and_no_figures_no_fraction():
    assert _step(0, (0.0, 0.2, 0.2), (1, 1, 1)).worst_process == 1
    s = _step(0, (0.0, 0.0), (0.0, 0.0))
    assert (s.worst_process, s.worst_fraction) == (0, None)


def test_summary_by_the_worst_host_of_each_step():
    steps = [
        _step(0, (0.00, 0.00), (1.0, 1.0)),  # fed
        _step(1, (0.01, 0.03), (1.0, 0.97)),  # 3 %: under 5 %
        _step(2, (0.10, 0.00), (0.9, 1.0)),  # 10 %: input-bound, process 0
        _step(3, (0.00, 0.50), (1.0, 0.5)),  # 50 %: highly, process 1
        _step(4, (0.00, 0.25), (1.0, 0.75)),  # 25 %: highly, process 1
    ]
    s = pod_summary(steps)
    assert s["pod_steps"] == 5
    assert s["pod_worst_data_wait_s"] == pytest.approx(0.0 + 0.03 + 0.10 + 0.50 + 0.25)
    worst_busy = 1.0 + 1.0 + 1.0 + 1.0 + 1.0  # each worst host's wait + its own step
    assert s["pod_input_bound_fraction"] == pytest.approx(0.88 / worst_busy)
    assert s["pod_input_bound_steps"] == pytest.approx(3 / 5)
    assert s["pod_highly_input_bound_steps"] == pytest.approx(2 / 5)
    assert s["pod_most_often_worst"] == {"process": 1, "steps": 2}


def test_summary_of_a_fed_pod_and_of_no_steps():
    fed = pod_summary([_step(i, (0.0, 0.001), (1.0, 1.0)) for i in range(4)])
    assert fed["pod_input_bound_steps"] == 0 and fed["pod_most_often_worst"] is None
    empty = pod_summary([])
    assert empty["pod_steps"] == 0
    assert empty["pod_input_bound_fraction"] is None and empty["pod_input_bound_steps"] is None


def _badput(run: str, processes: int, worst: list[tuple[float, int]]) -> RunBadput:
    """The figure of a run whose steps' worst hosts were `worst` (wait, process), in order."""
    tally = BadputTally()
    for wait_s, process in worst:
        tally.add(wait_s, process)
    return tally.figure(run, processes)


def test_a_runs_badput_is_its_first_batch_plus_its_later_steps():
    b = _badput("r", 4, [(2.0, 3), (0.1, 1), (0.0, 0), (0.4, 1)])
    assert (b.first_batch_wait_s, b.first_batch_process) == (2.0, 3)
    assert b.step_wait_s == pytest.approx(0.5) and b.badput_s == pytest.approx(2.5)
    assert _badput("r", 1, []).badput_s == 0 and _badput("r", 1, []).steps == 0


def test_the_jobs_badput_sums_each_runs_last_line_over_a_restart(tmp_path):
    path = tmp_path / "badput.jsonl"
    # Other lines are skipped, and a badput line cut short (a kill mid-write) too.
    path.write_text(
        '{"something": "else"}\nnot json\n{"record": "data_loading_badput", "run": "c"}\n'
    )
    append(path, _badput("a", 2, [(3.0, 0), (0.2, 1)]))
    append(path, _badput("a", 2, [(3.0, 0), (0.2, 1), (0.3, 1)]))  # a's figure grows
    append(path, _badput("b", 2, [(1.5, 1), (0.1, 0)]))  # the restart
    job = job_badput(path)
    assert job["restarts"] == 1
    assert job["first_batch_wait_s"] == pytest.approx(3.0 + 1.5)
    assert job["step_wait_s"] == pytest.approx(0.5 + 0.1)
    assert job["badput_s"] == pytest.approx(5.1)
    assert [r["run"] for r in job["runs"]] == ["a", "b"]
    line = json.loads(path.read_text().splitlines()[-1])
    assert line["record"] == RECORD and line["badput_s"] == pytest.approx(1.6)


@jax.jit
def _trivial(x):
    return x + 1


class Waits:
    def __init__(self):
        self.wait_time_s = 0.0


def test_one_process_runs_no_gather_and_keeps_its_summary_and_lines(tmp_path, monkeypatch):
    def no_gather(*args, **kwargs):
        raise AssertionError("a gather on one process")

    monkeypatch.setattr(timing, "PodGather", no_gather)
    records = tmp_path / "steps.jsonl"
    timer = StepTimer(records_path=records, pod_every=2)
    for _ in range(5):
        timer.step(_trivial, 1)
        assert len(records.read_text().splitlines()) == len(timer.records)  # not held back
    timer.flush()
    assert not timer.pod_steps
    assert not any(k.startswith("pod") for k in timer.summary())
    assert "pod" not in timer.format_summary()
    assert not any("worst_process" in line for line in records.read_text().splitlines())


def test_one_process_badput_is_its_own_waits(tmp_path):
    waits = Waits()
    path = tmp_path / "badput.jsonl"
    timer = StepTimer(data_source=waits, badput_path=path, pod_every=2)
    for wait in (1.0, 0.25, 0.0, 0.5, 0.125):
        waits.wait_time_s += wait
        timer.step(_trivial, 1)
    assert len(path.read_text().splitlines()) == 2  # every 2 steps
    timer.flush()
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["steps"] == 5 and last["processes"] == 1
    assert last["first_batch_wait_s"] == 1.0 and last["first_batch_process"] == 0
    assert last["step_wait_s"] == 0.875 and job_badput(path)["badput_s"] == 1.875


@pytest.mark.parametrize("value", [-1, 1.5, True, "10"])
def test_pod_every_must_be_a_whole_number_of_steps(value):
    with pytest.raises(ValueError, match="pod_every"):
        StepTimer(pod_every=value)


def test_a_window_comes_back_bit_for_bit_and_its_padding_left_out():
    # One process (eight CPU devices here): the same mesh, encoding and compiled gather a pod
    # uses, with one row.
    gather = PodGather(4)
    waits, steps = [0.1, 1 / 3], [2.0, 1e-9]  # float32 would round each of them
    gather.submit(8, waits, steps)
    assert gather.pending
    assert gather.collect() == [(8, (0.1,), (2.0,)), (9, (1 / 3,), (1e-9,))]
    assert not gather.pending and not gather.ready()
    with pytest.raises(RuntimeError, match="no gathered window"):
        gather.collect()


def test_a_gather_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        PodGather(0)


@pytest.mark.parametrize("value", [-1, 2.5, False, "100"])
def test_keep_records_must_be_a_whole_number_of_records(value):
    with pytest.raises(ValueError, match="keep_records"):
        StepTimer(keep_records=value)


def _other_wait(index: int) -> float:
    """The other process's wait for step `index`: every fifth step it waits most."""
    return 0.5 if index % 5 == 0 else 0.001


class TwoProcessGather:
    """Stands in for `PodGather` (a collective needs several JAX processes): a second process
    whose waits are `_other_wait`'s and whose steps take 1 s, gathered beside this one's
    figures; `arrives` says whether a window has arrived when the timer looks (else it is
    collected when the next one is due, so two windows' records wait at once)."""

    def __init__(self, window: int, arrives: bool):
        self.window, self.processes, self.arrives = window, 2, arrives
        self.rows: list[tuple[int, tuple[float, ...], tuple[float, ...]]] = []
        self._pending = None

    def submit(self, first_index: int, data_wait_s, step_s) -> None:
        assert self._pending is None and len(data_wait_s) <= self.window
        self._pending = [
            (first_index + i, (w, _other_wait(first_index + i)), (s, 1.0))
            for i, (w, s) in enumerate(zip(data_wait_s, step_s, strict=True))
        ]

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def ready(self) -> bool:
        return self.arrives and self.pending

    def collect(self):
        rows, self._pending = self._pending, None
        self.rows += rows
        return rows


@pytest.mark.parametrize("arrives", [True, False], ids=["arrived", "in_flight"])
def test_a_pod_run_longer_than_its_window_keeps_every_figure_and_line(
    tmp_path, monkeypatch, arrives
):
    """The pod's figures come from running sums, as the run's do: with `pod_steps` holding the
    latest steps only, they still equal `pod_summary` over every gathered step, and every
    step's line is written with its worst host, in order."""
    gathers = []

    def gather(window):
        gathers.append(TwoProcessGather(window, arrives))
        return gathers[-1]

    monkeypatch.setattr(timing, "PodGather", gather)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    path = tmp_path / "steps.jsonl"
    timer = StepTimer(pod_every=4, keep_records=6, records_path=path)
    names = ["profile" if i % 9 == 4 else None for i in range(23)]
    for i, name in enumerate(names):
        timer.step(_trivial, 1, name=name, data_wait_s=0.01 * (i % 3))
    timer.flush()

    rows = gathers[0].rows
    assert [i for i, _, _ in rows] == list(range(23))
    named = [name or ("compile" if i == 0 else "train") for i, name in enumerate(names)]
    every = [_step(i, w, t, name=n) for (i, w, t), n in zip(rows, named, strict=True)]
    assert [s.index for s in timer.pod_steps] == list(range(17, 23))
    assert [r.index for r in timer.records] == list(range(17, 23))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(23))
    assert [line["worst_process"] for line in lines] == [s.worst_process for s in every]
    assert [line["name"] for line in lines] == [s.name for s in every]
    s = timer.summary()
    for left_out, steps in [(("compile",), 22), (("compile", "profile"), 19), ((), 23)]:
        counted = [p for p in every if p.name not in left_out]
        expected = pod_summary(counted)
        s = timer.summary(exclude=left_out)
        # Sums over several names are added name by name: equal up to the order of adding.
        assert {k: s[k] for k in expected} == {
            k: pytest.approx(v) if isinstance(v, float) else v for k, v in expected.items()
        }
        assert s["pod_processes"] == 2 and s["pod_steps"] == steps
    assert timer.badput().steps == 23


def test_the_pod_summary_names_a_hosts_late_first_batch(monkeypatch):
    """The first step is left out of the summary's figures (its device time is compilation),
    and with it the wait of a host whose pipeline started late: this process's own first wait
    did not show it. The pod summary gives the worst host's first-batch wait apart."""
    monkeypatch.setattr(timing, "PodGather", lambda window: TwoProcessGather(window, True))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    timer = StepTimer(pod_every=4)
    timer.step(_trivial, 1, data_wait_s=0.1)  # the other process waits 0.5 s for its first
    s = timer.summary()
    assert s["pod_first_data_wait_s"] is None and s["pod_first_process"] is None  # not gathered
    for _ in range(5):
        timer.step(_trivial, 1, data_wait_s=0.0)
    timer.flush()
    s = timer.summary()
    assert s["first_data_wait_s"] == 0.1  # this process's own
    assert (s["pod_first_data_wait_s"], s["pod_first_process"]) == (0.5, 1)
    # The counted steps' figures stay theirs: step 5's wait, the other process's again.
    assert s["pod_steps"] == 5 and s["pod_worst_data_wait_s"] == pytest.approx(0.5 + 4 * 0.001)
    assert timer.badput().first_batch_wait_s == s["pod_first_data_wait_s"]
    rows = dict(line.split("  ", 1) for line in timer.format_summary().splitlines())
    assert rows["pod first batch wait (worst host)"].strip() == "0.500 s (process 1)"
