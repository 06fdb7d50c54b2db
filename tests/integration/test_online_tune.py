""" "auto" tuned on the live stream (`serving/retune.py`, `autotune/online.py`): a stream starts
at once, moves to the fewest workers that meet its loop's demand, follows the demand when it
moves, and every batch stays the bytes a fixed count gives."""

from __future__ import annotations

import threading
import time

import pytest

from input_client import InputClient
from input_server.autotune.online import SERVER_CAP
from input_server.batching.parallelism import Parallelism, default_threads
from input_server.batching.pipeline import MIN_GROUP, Pipeline
from input_server.serving.server import Server, ServerConfig
from input_server.testing import SlowPipeline
from tests.support import assert_same_batches, consume_until, run_pipeline, wait_for

# The tuner measures throughput and the loop's pace: another test's load moves what it picks.
pytestmark = pytest.mark.alone

DELAY_S = 0.004  # per record: remote storage's latency, which threads overlap without CPU


def settled(stream) -> bool:
    return stream.tuning_state == "settled"


@pytest.fixture
def idle_host(monkeypatch):
    """The host's busy cores read as the server's own (this process's tree), as on a host that
    runs nothing else: worker processes could gain there, so a search that needs more proposes
    them. On a host kept busy by others (another test, a CPU burner) it rightly does not
    (`shared_cores.Cores.busy`), which would leave these tests nothing to see."""
    from input_server.autotune.measure import tree_cpu_seconds
    from input_server.serving import retune

    monkeypatch.setattr(retune, "host_busy_seconds", tree_cpu_seconds)


def test_an_auto_stream_starts_at_once_and_tunes_while_it_serves(tmp_path, make_spec):
    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "tune_seconds": 5})
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec) as it,
    ):
        next(it)
        (first,) = client.info().streams
        stream = consume_until(it, client, settled, pace=50)
    # The first batch came before any measurement: the tuning happens on the stream.
    assert first.tuning_state == "searching"
    assert "started at once" in first.worker_reason
    assert stream.worker_reason.startswith("auto: ") and stream.worker_tuning.reason


def test_an_auto_stream_starts_within_its_specs_memory_budget(tmp_path, make_spec):
    # 8 MiB is one thread's group of documents in flight: the stream starts with one thread,
    # as its search would allow, not with the host's default.
    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "ram_budget_mb": 8})
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec) as it,
    ):
        next(it)
        (first,) = client.info().streams
    assert (first.worker_processes, first.worker_threads) == (0, 1), first.worker_reason


def slow_pipeline(spec) -> SlowPipeline:
    pipeline = SlowPipeline(spec, delay_s=DELAY_S)
    pipeline.group_size = MIN_GROUP  # short groups: a window holds several
    return pipeline


def one_thread_rate(spec) -> float:
    """Batches a second one in-process thread makes of the slow pipeline (no server)."""
    pipeline = slow_pipeline(spec)
    with pipeline.stream(parallelism=Parallelism(0, 1)) as stream:
        next(stream)
        start, n = time.monotonic(), 0
        for _ in stream:
            n += 1
            if time.monotonic() - start > 2:
                break
    return n / (time.monotonic() - start)


def test_a_throttled_loop_gets_few_workers_and_a_faster_loop_gets_more(tmp_path, make_spec):
    """Over storage whose latency threads overlap: a loop at a quarter of what one thread makes
    gets one thread; when it speeds up 6 x (past what one thread makes) the stream re-tunes to
    more; the batches through it all, across every switch, are those of a fixed count."""
    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "tune_seconds": 15})
    one = one_thread_rate(spec)
    got: list = []
    with (
        Server(
            ServerConfig(
                listen=[f"unix://{tmp_path}/s.sock"], pipelines={"slow": slow_pipeline(spec)}
            )
        ) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches("slow") as it,
    ):
        slow = consume_until(it, client, settled, pace=one / 4, into=got)
        assert (slow.worker_processes, slow.worker_threads) == (0, 1), slow
        assert slow.worker_tuning.reason == "target met"
        # The loop's pace is at most one / 4 (it sleeps that long a batch), slower when a busy
        # host slows production too: the demand seen never exceeds it, and is the loop's, not
        # the production's (tests/integration/test_flow_control.py holds it to the pace).
        assert 0 < slow.demand_batches_per_s <= 1.2 * one / 4, slow
        fast = consume_until(
            it,
            client,
            lambda s: settled(s) and len(s.switches) > len(slow.switches) and s.worker_threads > 1,
            pace=1.5 * one,
            into=got,
        )
    retuned = fast.switches[len(slow.switches)]
    assert retuned.reason.startswith("re-tuning: "), fast.switches
    assert retuned.from_threads == 1
    assert max(1, fast.worker_processes) * fast.worker_threads >= 2
    assert len(got) > 100
    assert_same_batches(got, run_pipeline(Pipeline(spec), limit=len(got)))


def test_live_tuning_takes_worker_processes_from_the_server_and_gives_them_back(
    tmp_path, make_spec, idle_host
):
    """A target no parallelism meets walks the whole ladder, worker processes included, within
    the server's --max-workers; the processes return to the server when the stream ends."""
    # The search's time bound well past its ladder's time on a loaded host (worker processes
    # start slowly there): the walk ends at the top of the ladder, not at the bound; `timeout`
    # is a hang guard past both.
    spec = make_spec(
        order={"epochs": 0},
        workers={"count": "auto", "tune_seconds": 120, "target_batches_per_s": 1e6},
    )
    fixed = make_spec(order={"epochs": 0}, workers={"count": 2})
    got: list = []
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], max_workers=2)
    with Server(config) as srv, InputClient(srv.targets[0]) as client:
        with client.batches(spec) as it:
            stream = consume_until(it, client, settled, into=got, timeout=180)
        assert any(w.to_processes == 2 for w in stream.switches), stream.switches
        assert stream.worker_tuning.reason != "target met"
        # The stream leaves the server's list once its teardown (its processes' end) is done;
        # a fixed count waits only PROCESS_WAIT_S for processes still closing.
        wait_for(lambda: not client.info().streams, "the tuned stream's end", timeout=60)
        with client.batches(fixed) as it:  # both processes are free again
            next(it)
            (again,) = client.info().streams
            assert again.worker_processes == 2
    assert_same_batches(got, run_pipeline(Pipeline(spec), limit=len(got)))


def test_a_choice_the_servers_free_processes_cut_short_is_not_remembered(
    tmp_path, make_spec, idle_host
):
    # Over storage whose latency leaves the server's cores idle, on a host idle but for the
    # server (`idle_host`), so the search proposes worker processes (a CPU-bound stream on a
    # loaded 2-core host never does: rule 1).
    # The search's time bound well past its ladder's time on a loaded host (a CI run's own
    # workers): at 30 s it once stopped at threads, before proposing a process (alone: ~8 s).
    spec = make_spec(
        order={"epochs": 0},
        workers={"count": "auto", "tune_seconds": 120, "target_batches_per_s": 1e6},
    )
    cache = tmp_path / "tune"
    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"],
        max_workers=1,
        tune_cache=str(cache),
        pipelines={"slow": slow_pipeline(spec)},
    )
    with Server(config) as srv, InputClient(srv.targets[0]) as client, client.batches("slow") as it:
        stream = consume_until(it, client, settled, timeout=180)
    skipped = [m for m in stream.worker_tuning.measurements if m.skipped == SERVER_CAP]
    assert skipped and stream.worker_processes <= 1, stream
    assert not cache.exists() or not list(cache.iterdir())  # a later stream tunes again


def test_a_stage_that_will_not_open_is_searched_around_and_its_processes_given_back(
    make_spec, monkeypatch
):
    from input_server.autotune.live import Window
    from input_server.autotune.online import OnlineSearch, Step
    from input_server.batching import batch_stream
    from input_server.batching.batch_stream import BatchStream
    from input_server.batching.meter import LiveMeter
    from input_server.batching.resume import Position
    from input_server.serving.retune import StreamTuner
    from input_server.serving.slots import ProcessPool, ProcessReservation

    pipeline = Pipeline(make_spec(order={"epochs": 0}))
    stream = BatchStream(pipeline, Position(), Parallelism(0, 1), meter=LiveMeter())
    opens = batch_stream.parallel  # every stage: where a batch starts, or beside (`handover.py`)

    def no_worker_processes(groups, *, processes, threads):  # e.g. the host's limit
        if processes:
            raise OSError("cannot start a worker process")
        return opens(groups, processes=processes, threads=threads)

    monkeypatch.setattr(batch_stream, "parallel", no_worker_processes)
    pool = ProcessPool(2)
    reserved = ProcessReservation(pool)
    search = OnlineSearch(Parallelism(0, 1), cpus=2, default_threads=default_threads)
    tuner = StreamTuner(
        stream, search, taken=lambda: 0, processes=reserved, remember=lambda tuning: None
    )
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            next(stream)

    consumer = threading.Thread(target=loop, daemon=True)
    consumer.start()
    try:
        measured = Window(
            seconds=1.0,
            batches=10,
            tokens=1000,
            groups=10,
            group_s=1.0,
            waiting_s=0.0,
            blocked_s=0.0,
            workers=1,
        )
        search.observe(measured, demand=None, now=1.0, cpu_cores=1.0, rss_mb=0.0)
        tuner._follow(Step(to=Parallelism(1, 1), reason="test: one worker process"), measured, None)
        # The stage that would not open left no trace but a skipped row, held no process,
        # and the search went on to a parallelism that opens.
        assert (pool.free(), reserved.held) == (2, 0)
        assert Parallelism(1, 1) not in [s.after for s in tuner.history]
        assert any(
            (m.parallelism, m.skipped) == (Parallelism(1, 1), SERVER_CAP) for m in search.rows
        )
        assert stream.parallelism.in_process
    finally:
        stop.set()
        consumer.join(timeout=10)
        stream.close()


def test_a_window_across_a_tokenizer_trial_is_dropped_a_few_times_at_most(make_spec):
    """A window in which the tokenizer's backend was on trial against the reference times the
    trial (a phase of the slower side), not the parallelism: the tuner drops it, but no more
    than MAX_TRIAL_WINDOWS in a row (a trial that keeps starting over does not stop the
    search)."""
    from input_server.autotune.online import OnlineSearch
    from input_server.batching.batch_stream import BatchStream
    from input_server.batching.meter import LiveMeter
    from input_server.batching.resume import Position
    from input_server.serving import retune
    from input_server.serving.slots import ProcessPool, ProcessReservation

    pipeline = Pipeline(make_spec(order={"epochs": 0}))
    stream = BatchStream(pipeline, Position(), Parallelism(0, 1), meter=LiveMeter())
    trial = [0, False]  # the tokenizer's trials begun, and whether one runs
    tuner = retune.StreamTuner(
        stream,
        OnlineSearch(Parallelism(0, 1), cpus=2, default_threads=default_threads),
        taken=lambda: 0,
        processes=ProcessReservation(ProcessPool(2)),
        remember=lambda tuning: None,
        trials=lambda: tuple(trial),
    )
    try:
        assert not tuner._across_trial((0, False))  # no trial in the window: measured
        trial[:] = [1, True]  # one began in the next and runs on
        most = retune.MAX_TRIAL_WINDOWS
        assert [tuner._across_trial((0, False)) for _ in range(most + 1)] == [True] * most + [False]
        assert tuner._across_trial((1, True))  # dropped again after one measured
        trial[:] = [1, False]
        assert tuner._across_trial((1, True))  # it ended within the window
        assert not tuner._across_trial((1, False))  # judged before the window: measured
    finally:
        stream.close()
