"""How a stream of "auto" opens when nothing is remembered for its spec: in process, on few
threads whatever the host's cores (its first batch needs a group or two), within the spec's
max_workers; a fixed count opens as it is."""

from __future__ import annotations

import pytest

from input_server.autotune.openings import OPENING_THREADS, Openings
from input_server.batching import parallelism
from input_server.batching.pipeline import Pipeline
from input_server.plurals import plural
from input_server.serving.slots import ProcessPool, ProcessReservation


@pytest.mark.parametrize("cores", [1, 2, 13, 64])
def test_auto_opens_in_process_on_few_threads_whatever_the_cores(make_spec, monkeypatch, cores):
    monkeypatch.setattr(parallelism, "cpu_count", lambda: cores)
    opening = Openings().choose(
        Pipeline(make_spec(workers={"count": "auto"})),
        processes=ProcessReservation(ProcessPool(4)),
    )
    want = min(cores, OPENING_THREADS)
    assert (opening.parallelism.processes, opening.parallelism.threads) == (0, want)
    assert f"started at once in process with {plural(want, 'thread')};" in opening.reason


def test_auto_opens_within_max_workers(make_spec, monkeypatch):
    monkeypatch.setattr(parallelism, "cpu_count", lambda: 13)
    spec = make_spec(workers={"count": "auto", "max_workers": 1})
    opening = Openings().choose(Pipeline(spec), processes=ProcessReservation(ProcessPool(4)))
    assert opening.parallelism.threads == 1


def test_a_fixed_count_opens_as_it_is(make_spec, monkeypatch):
    monkeypatch.setattr(parallelism, "cpu_count", lambda: 13)
    spec = make_spec(workers={"count": 0, "threads": 8})
    opening = Openings().choose(Pipeline(spec), processes=ProcessReservation(ProcessPool(4)))
    assert (opening.parallelism.threads, opening.reason) == (
        8,
        "fixed by workers.count and workers.threads",
    )
