"""`Parallelism`: one value for processes x threads, ordered by cost, printed as the tables
print it, and written to the tune cache as before."""

from __future__ import annotations

import json

import pytest

from input_server.autotune.measurements import Measurement, Tuning
from input_server.batching.parallelism import Parallelism


def test_the_order_is_the_cost_order():
    # In-process threads before any worker process, then fewer processes, then fewer threads.
    cheapest_first = [
        Parallelism(0, 1),
        Parallelism(0, 2),
        Parallelism(0, 128),
        Parallelism(2, 1),
        Parallelism(2, 4),
        Parallelism(4, 1),
    ]
    assert sorted(reversed(cheapest_first)) == cheapest_first
    assert Parallelism(0, 64) < Parallelism(2, 1)  # more workers, but no process to start
    assert min(cheapest_first[3:]) == Parallelism(2, 1)


@pytest.mark.parametrize(
    "processes, threads, workers",
    [(0, 1, 1), (0, 8, 8), (1, 4, 4), (2, 4, 8), (8, 1, 8)],
    ids=["one-thread", "threads-in-process", "one-process", "processes-x-threads", "processes"],
)
def test_workers_are_groups_in_flight(processes, threads, workers):
    assert Parallelism(processes, threads).workers == workers


def test_printed_as_the_reports_label_it():
    assert str(Parallelism(0, 4)) == "in-proc x 4 thr"
    assert str(Parallelism(2, 1)) == "2 proc x 1 thr"
    assert f"{Parallelism(0, 1)}" == "in-proc x 1 thr"


@pytest.mark.parametrize(
    "processes, threads, message",
    [
        (-1, 1, "`processes` must be an integer of at least 0, got -1."),
        (0, 0, "`threads` must be an integer of at least 1, got 0."),
        (0, 1.5, "`threads` must be an integer of at least 1, got 1.5."),
        (True, 1, "`processes` must be an integer of at least 0, got True."),
        ("2", 1, "`processes` must be an integer of at least 0, got '2'."),
    ],
    ids=["negative-processes", "no-threads", "fractional", "bool", "string"],
)
def test_a_parallelism_that_cannot_run_is_refused(processes, threads, message):
    with pytest.raises(ValueError) as e:
        Parallelism(processes, threads)
    assert str(e.value) == message


def test_frozen_and_hashable():
    p = Parallelism(2, 4)
    with pytest.raises(AttributeError):
        p.threads = 8  # type: ignore[misc]
    assert {p: 1}[Parallelism(2, 4)] == 1


def test_numpy_integers_become_ints():
    np = pytest.importorskip("numpy")
    p = Parallelism(np.int64(2), np.int32(3))
    assert type(p.processes) is int and type(p.threads) is int
    assert json.dumps(p.to_dict()) == '{"processes": 2, "threads": 3}'


def test_fixed_takes_the_default_threads_unless_given():
    assert Parallelism.fixed(2, 3) == Parallelism(2, 3)
    assert Parallelism.fixed(0).threads >= 1


def a_tuning() -> Tuning:
    return Tuning(
        parallelism=Parallelism(0, 2),
        reason="plateau",
        detail="180 batches/s",
        measurements=(
            Measurement(parallelism=Parallelism(0, 1), batches_per_s=100.0, rss_mb=3.0),
            Measurement(parallelism=Parallelism(0, 2), batches_per_s=180.0, rss_mb=5.0),
            Measurement(parallelism=Parallelism(2, 1), skipped="max workers"),
        ),
        tune_seconds=2.5,
    )


def test_the_cache_json_keeps_its_keys_and_their_order():
    d = a_tuning().to_dict()
    assert list(d) == [
        "processes",
        "threads",
        "reason",
        "detail",
        "measurements",
        "target_batches_per_s",
        "ram_budget_mb",
        "max_workers",
        "tune_seconds",
        "workers",
    ]
    assert (d["processes"], d["threads"], d["workers"], d["ram_budget_mb"]) == (0, 2, 2, None)
    m = d["measurements"][2]
    assert list(m)[:2] == ["processes", "threads"]
    assert list(m)[-3:] == ["skipped", "workers", "rss_mb_per_worker"]
    assert (m["processes"], m["threads"], m["workers"]) == (2, 1, 2)


def test_a_tuning_round_trips_through_the_cache_json():
    tuning = a_tuning()
    again = Tuning.from_dict(json.loads(json.dumps(tuning.to_dict())))
    assert again == tuning
    assert again.parallelism == Parallelism(0, 2) and again.chosen.batches_per_s == 180.0


def test_a_cache_file_written_before_the_type_still_reads():
    """The layout the tune cache had when (processes, threads) were a tuning's own fields."""
    old = {
        "processes": 0,
        "threads": 2,
        "reason": "plateau",
        "detail": "180 batches/s",
        "measurements": [
            {
                "processes": 0,
                "threads": 2,
                "batches_per_s": 180.0,
                "tokens_per_s": 7e4,
                "rss_mb": 5.0,
                "cpu_cores": 1.7,
                "startup_s": 0.1,
                "seconds": 1.0,
                "batches": 180,
                "samples": 1,
                "skipped": "",
                "workers": 2,
                "rss_mb_per_worker": 2.5,
            }
        ],
        "target_batches_per_s": 0.0,
        "ram_budget_mb": None,
        "max_workers": 0,
        "tune_seconds": 2.5,
        "workers": 2,
    }
    tuning = Tuning.from_dict(old)
    assert tuning.parallelism == Parallelism(0, 2)
    assert tuning.chosen.parallelism == Parallelism(0, 2)
    assert tuning.to_dict() == old


def test_a_cache_entry_with_a_parallelism_that_cannot_run_is_refused():
    d = a_tuning().to_dict()
    d["threads"] = 0
    with pytest.raises(ValueError):
        Tuning.from_dict(d)
