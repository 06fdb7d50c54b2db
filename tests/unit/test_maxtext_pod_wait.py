"""The MaxText adapter's pod view on one JAX process: no gather runs, the log and metrics
gain nothing, and the run's badput is its own first wait plus its later ones, a line every
`BADPUT_EVERY` steps and at the end. (Two processes: tests/system/test_maxtext_pod.py.)"""

from __future__ import annotations

import json

import pytest

from input_client.badput import job_badput
from input_client.maxtext._pod_wait import BADPUT_EVERY, PodWait

WAITS = [0.5, 0.01, 0.0, 0.02] + [0.001] * (BADPUT_EVERY + 2)


def test_one_process_is_its_own_worst_host_and_adds_nothing_to_the_log(tmp_path):
    path = tmp_path / "badput.jsonl"
    pod = PodWait(path)
    scalars = {}
    for step, waited in enumerate(WAITS, start=7):  # a restored run starts past 0
        pod.record(step, waited, 0.3)
        worst = pod.worst(step)
        assert (worst.worst_process, worst.worst_data_wait_s) == (0, waited)
        pod.add_scalars(scalars, worst)
        assert pod.words(worst) == ""
    assert scalars == {}  # MaxText's own data_wait scalar is the figure
    assert pod.worst(99) is None  # a step never recorded
    # A line after BADPUT_EVERY steps, then the run's end.
    assert len(path.read_text().splitlines()) == 1
    pod.write_badput()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["steps"] for r in lines] == [BADPUT_EVERY, len(WAITS)]
    assert lines[-1]["processes"] == 1 and lines[-1]["first_batch_process"] == 0
    figure = job_badput(path)
    assert figure["restarts"] == 0
    assert figure["first_batch_wait_s"] == WAITS[0]
    assert figure["step_wait_s"] == pytest.approx(sum(WAITS[1:]))


def test_no_path_no_file_and_a_step_counted_once(tmp_path):
    pod = PodWait()
    pod.record(0, 0.2, 0.3)
    assert pod.worst(0) is not None and pod.worst(0) is None
    pod.write_badput()
    assert pod.badput().steps == 1 and pod.badput().badput_s == 0.2
    assert list(tmp_path.iterdir()) == []
