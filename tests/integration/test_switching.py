"""Switching a stream's processes x threads between batches never loses, repeats or changes a
batch: byte-identical to a fixed count, at random switch points."""

from __future__ import annotations

import random
import time

import pytest

from input_server.batching import batch_stream
from input_server.batching.batch_stream import BatchStream, ServedStream
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import MIN_GROUP, Pipeline
from input_server.batching.resume import Position
from input_server.testing import SlowPipeline
from tests.support import assert_same_batches, run_pipeline

# In process first (cheap), a few worker-process stages among them (each spawns workers).
CHOICES = [Parallelism(p, t) for p, t in ((0, 1), (0, 2), (0, 4), (1, 1), (2, 1))]


@pytest.mark.parametrize("seed", [0, 1])
def test_random_switches_give_the_fixed_count_batches(make_spec, seed):
    spec = make_spec(batch={"size": 4, "seq_len": 128})
    pipeline = Pipeline(spec)
    want = run_pipeline(pipeline)
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, len(want) - 1), 5))
    got = []
    with BatchStream(pipeline, Position(), Parallelism(0, 1)) as stream:
        for i, produced in enumerate(stream):
            got.append(produced)
            if i in points:
                now = stream.parallelism
                stream.switch(rng.choice([c for c in CHOICES if c != now]))
        assert stream.switches == len(points)
    assert_same_batches(got, want)


def test_a_switch_asked_twice_before_a_batch_takes_the_last(make_spec):
    pipeline = Pipeline(make_spec())
    with BatchStream(pipeline, Position(), Parallelism(0, 1)) as stream:
        next(stream)
        stream.switch(Parallelism(0, 4))
        stream.switch(Parallelism(0, 2))
        next(stream)
        assert (stream.parallelism.threads, stream.switches) == (2, 1)
        stream.switch(Parallelism(0, 2))  # the same parallelism again
        next(stream)
        assert stream.switches == 1


def test_a_switch_from_a_resumed_position(make_spec):
    pipeline = Pipeline(make_spec())
    want = run_pipeline(pipeline)
    state = want[6].state
    with BatchStream(pipeline, pipeline.parse_state(state), Parallelism(0, 2)) as stream:
        got = [next(stream)]
        stream.switch(Parallelism(1, 1))
        got += list(stream)
    assert_same_batches(got, want[7:])


def test_a_stage_that_will_not_open_leaves_the_stream_as_it_was(make_spec, monkeypatch, caplog):
    spec = make_spec()
    pipeline = Pipeline(spec)
    with BatchStream(pipeline, Position(), Parallelism(0, 1)) as stream:
        got = [next(stream)]
        monkeypatch.setattr(batch_stream, "parallel", lambda *a, **k: 1 / 0)
        stream.switch(Parallelism(0, 4))
        got += [next(stream) for _ in range(5)]
        assert (stream.parallelism.threads, stream.switches, stream.failed_switches) == (1, 0, 1)
        monkeypatch.undo()  # stages open again: the fixed count's stream below
    assert "switching to 0 processes x 4 threads failed" in caplog.text
    assert_same_batches(got, run_pipeline(spec, limit=len(got)))


def test_every_stream_is_a_served_stream(make_spec):
    """The server's one stream type: a stream has every member `ServedStream` declares,
    whether the server or a caller of `Pipeline.stream` opened it."""
    pipeline = Pipeline(make_spec())
    with BatchStream(pipeline, Position(), Parallelism(0, 1)) as stream:
        next(stream)
        assert isinstance(stream, ServedStream)
    with pipeline.stream(parallelism=Parallelism(0, 1)) as plain:
        assert isinstance(plain, ServedStream) and type(plain) is BatchStream


def many_groups(spec) -> Pipeline:
    """The spec's pipeline over storage with latency, in short groups (a handover needs groups
    left after the running stage's read-ahead; the test corpus is one default group)."""
    pipeline = SlowPipeline(spec, delay_s=0.002)
    pipeline.group_size = MIN_GROUP
    return pipeline


@pytest.mark.parametrize("to", [Parallelism(0, 4), Parallelism(2, 1)], ids=["threads", "processes"])
def test_a_switch_opens_the_new_stage_beside_the_running_one(make_spec, to):
    """The running stage serves while the new one starts (worker processes: ~1-2 s without a
    batch when the switch waited for them); the packer moves to it at a group boundary, and
    the batches are the fixed count's."""
    spec = make_spec(order={"epochs": 0}, batch={"size": 2, "seq_len": 64})
    pipeline = many_groups(spec)
    got, at = [], []
    with BatchStream(pipeline, Position(), Parallelism(0, 1)) as stream:
        got += [next(stream) for _ in range(20)]  # the running stage's pace, for the lead
        asked = stream.switch(to)
        while not asked.wait(0) and len(got) < 5000:
            got.append(next(stream))
            at.append(stream.parallelism)
        assert asked.made and stream.parallelism == to
        # The batches right after the ask came from the running stage, while `to` started.
        assert at[0] == Parallelism(0, 1), at[:3]
        got += [next(stream) for _ in range(20)]
        ready_s = stream.handover_ready_s
    assert_same_batches(got, run_pipeline(many_groups(spec), limit=len(got)))
    assert ready_s > 0


@pytest.mark.alone  # times a gap against the processes' start: others' load stretches both
def test_worker_processes_start_without_stopping_the_stream(make_spec):
    """While two worker processes start (`ready_s`), the stream goes on: its longest wait for
    a batch across the switch is a fraction of their start."""
    pipeline = many_groups(make_spec(order={"epochs": 0}, batch={"size": 2, "seq_len": 64}))
    with BatchStream(pipeline, Position(), Parallelism(0, 2)) as stream:
        for _ in range(20):  # the running stage's pace, for the handover's lead
            next(stream)
        asked = stream.switch(Parallelism(2, 1))
        longest, last = 0.0, time.monotonic()
        while not asked.wait(0):
            next(stream)
            now = time.monotonic()
            longest, last = max(longest, now - last), now
        for _ in range(5):
            next(stream)
            now = time.monotonic()
            longest, last = max(longest, now - last), now
        ready_s = stream.handover_ready_s
    assert asked.made
    assert longest < 0.5 * ready_s, (longest, ready_s)
