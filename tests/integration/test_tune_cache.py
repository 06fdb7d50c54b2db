""" "auto" choices remembered across server restarts (`autotune/remembered.py`): a restarted
server starts the spec's streams at the remembered parallelism at once; a corrupt or foreign
cache file is ignored with a warning, never a failed stream."""

from __future__ import annotations

import json
import logging
import os
import stat

import numpy as np
import pytest

from input_client import InputClient
from input_server.autotune import remembered
from input_server.autotune.measurements import Measurement, Tuning
from input_server.autotune.openings import opening_threads
from input_server.autotune.remembered import TuneCache
from input_server.batching.parallelism import Parallelism
from input_server.plurals import plural
from input_server.serving.server import Server, ServerConfig


def a_tuning() -> Tuning:
    rows = (
        Measurement(
            parallelism=Parallelism(0, 1),
            batches_per_s=100.0,
            tokens_per_s=4e4,
            rss_mb=3.0,
            cpu_cores=0.9,
            startup_s=0.1,
            seconds=1.0,
            batches=100,
        ),
        Measurement(
            parallelism=Parallelism(0, 2),
            batches_per_s=180.0,
            tokens_per_s=7e4,
            rss_mb=5.0,
            cpu_cores=1.7,
            startup_s=0.1,
            seconds=1.0,
            batches=180,
        ),
        Measurement(parallelism=Parallelism(2, 1), skipped="max workers"),
    )
    return Tuning(
        parallelism=Parallelism(0, 2),
        reason="plateau",
        detail="180 batches/s",
        measurements=rows,
        ram_budget_mb=float("inf"),
        tune_seconds=2.5,
    )


def test_a_choice_comes_back_as_it_was_put(tmp_path, make_spec):
    cache = TuneCache(str(tmp_path / "tune"))
    spec = make_spec(workers={"count": "auto"})
    assert cache.get(spec) is None
    cache.put(spec, a_tuning())
    assert cache.get(spec) == a_tuning()
    (path,) = (tmp_path / "tune").iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "tune").stat().st_mode) == 0o700
    # Another demand, other data, another host's CPU count: other keys.
    assert cache.get(make_spec(workers={"count": "auto", "target_batches_per_s": 5})) is None
    assert cache.get(make_spec(workers={"count": "auto"}, order={"seed": 3})) is None


def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning(
    tmp_path, make_spec, caplog, monkeypatch
):
    cache = TuneCache(str(tmp_path))
    spec = make_spec(workers={"count": "auto"})
    cache.put(spec, a_tuning())
    (path,) = tmp_path.iterdir()
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert cache.get(spec) is None
    assert str(path) in caplog.text and "cannot be read" in caplog.text
    caplog.clear()
    record = {"key": {**remembered.key_fields(spec), "cpus": 999}, "tuning": {}}
    path.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        assert cache.get(spec) is None
    assert "another spec, host or version" in caplog.text
    caplog.clear()
    path.write_text(json.dumps({"key": remembered.key_fields(spec), "tuning": {"x": 1}}))
    with caplog.at_level(logging.WARNING):
        assert cache.get(spec) is None
    assert str(path) in caplog.text


def test_an_unwritable_cache_warns_and_the_stream_goes_on(tmp_path, make_spec, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = TuneCache(str(blocker / "tune"))  # a folder under a file: cannot be made
    with caplog.at_level(logging.WARNING):
        cache.put(make_spec(workers={"count": "auto"}), a_tuning())
    assert "cannot write" in caplog.text


def test_a_restarted_server_starts_at_the_remembered_choice_at_once(tmp_path, make_spec):
    from tests.support import consume_until

    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "tune_seconds": 4})
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], tune_cache=str(tmp_path / "t"))

    def settled(stream) -> bool:
        return stream.tuning_state == "settled"

    with Server(config) as srv, InputClient(srv.targets[0]) as client, client.batches(spec) as it:
        tuned = consume_until(it, client, settled, pace=50)
    assert "remembered" not in tuned.worker_reason
    assert "candidates measured" in tuned.worker_reason
    assert len(os.listdir(tmp_path / "t")) == 1
    with (
        Server(config) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec) as it,
    ):  # a new server: nothing in memory
        next(it)
        (again,) = client.info().streams
    # From its first batch, at the choice, without a search.
    assert again.worker_reason.startswith("auto, remembered: ")
    assert again.worker_reason.split(": ", 1)[1] == tuned.worker_reason.split(": ", 1)[1]
    assert (again.worker_processes, again.worker_threads) == (
        tuned.worker_processes,
        tuned.worker_threads,
    )
    assert again.tuning_state == "settled" and not again.switches
    # Without a cache folder, a new server starts provisionally and tunes again.
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/u.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec) as it,
    ):
        next(it)
        (fresh,) = client.info().streams
        assert "remembered" not in fresh.worker_reason
        assert fresh.tuning_state == "searching"


@pytest.mark.parametrize("value, expected", [("off", None), (None, "default")])
def test_serve_tune_cache_flag(value, expected, monkeypatch, tmp_path):
    from input_server.cli import serve

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    got = serve.tune_cache(value)
    assert got == (None if expected is None else str(tmp_path / "input-server" / "tune"))


def remember_two_processes(spec, folder) -> None:
    """A choice of 2 worker processes x 1 thread kept for `spec` in the cache at `folder`."""
    from dataclasses import replace

    from input_client import PipelineSpec

    served = PipelineSpec.from_proto(spec.to_proto())  # the spec as the server reads it
    TuneCache(str(folder)).put(
        served,
        replace(
            a_tuning(),
            parallelism=Parallelism(2, 1),
            measurements=(
                *a_tuning().measurements[:2],
                Measurement(
                    parallelism=Parallelism(2, 1),
                    batches_per_s=300.0,
                    tokens_per_s=1e5,
                    rss_mb=90.0,
                    cpu_cores=1.9,
                    startup_s=1.0,
                    seconds=1.0,
                    batches=300,
                ),
            ),
        ),
    )


def test_a_remembered_choice_of_processes_makes_the_first_batch_in_process(tmp_path, make_spec):
    """Worker processes take seconds to start (a TPU host's restart waited ~2 s for them): the
    stream's first batch is made in process, then it switches to the remembered 2 processes
    and stays settled there, every batch as a stream that never switched makes it."""
    from tests.support import consume_until

    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "tune_seconds": 3})
    remember_two_processes(spec, tmp_path / "t")
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], tune_cache=str(tmp_path / "t"))
    got: list = []
    with Server(config) as srv, InputClient(srv.targets[0]) as client, client.batches(spec) as it:
        got.append(next(it))
        (opened,) = client.info().streams
        switched = consume_until(it, client, lambda s: s.worker_processes == 2, into=got)
        got += [next(it) for _ in range(20)]  # from the processes' stage
        (stream,) = client.info().streams
    threads = opening_threads()
    assert (opened.worker_processes, opened.worker_threads) == (0, threads), opened
    assert opened.worker_reason.startswith("auto, remembered: "), opened.worker_reason
    assert opened.worker_reason.endswith(
        f"its first batch in process on {plural(threads, 'thread')}"
    )
    assert [(s.to_processes, s.to_threads) for s in switched.switches] == [(2, 1)]
    assert switched.switches[0].reason == "remembered: its first batch made in process"
    assert stream.worker_reason.startswith("auto, remembered: ") and "first batch" not in (
        stream.worker_reason
    )
    assert stream.tuning_state == "settled" and len(stream.switches) == 1
    fixed = spec.replace(workers={"count": 0, "threads": 1})
    with Server(config) as srv, InputClient(srv.targets[0]) as client, client.batches(fixed) as it:
        want = [next(it) for _ in got]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert all(np.array_equal(a[k], b[k]) for k in b), f"batch {i} differs"


def test_a_remembered_choice_clipped_by_busy_processes_tunes_again(tmp_path, make_spec):
    """Remembered: 2 processes; the server has 1 to give. The stream starts with what it can
    have and searches from there, instead of sitting settled on a clipped choice."""
    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "tune_seconds": 3})
    remember_two_processes(spec, tmp_path / "t")
    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"], tune_cache=str(tmp_path / "t"), max_workers=1
    )
    with Server(config) as srv, InputClient(srv.targets[0]) as client, client.batches(spec) as it:
        next(it)
        (stream,) = client.info().streams
    assert stream.worker_processes == 1 and "clipped" in stream.worker_reason
    assert stream.tuning_state == "searching"
