"""The loop's dispatch window (`input_client.quiet`): the client's background threads keep off
the GIL for a share of the loop's interval after each batch it takes, never while the loop has
no batch queued. A fake clock, so the windows are checked exactly."""

from __future__ import annotations

import pytest

from input_client import quiet
from input_client.quiet import LEAST_S, MOST_S, SHARE, Quiet


class Clock:
    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(quiet, "clock", c)
    monkeypatch.setattr(quiet, "sleep", c.sleep)
    return c


def _loop(q: Quiet, clock: Clock, interval: float, batches: int) -> None:
    for _ in range(batches):
        q.taken()
        clock.now += interval


def test_a_loop_that_never_took_a_batch_is_never_held(clock):
    q = Quiet()
    q.hold(lambda: True)
    assert clock.slept == [] and q.window_s() == 0


def test_the_window_is_a_share_of_the_loop_s_interval_capped(clock):
    fast, slow = Quiet(), Quiet()
    _loop(fast, clock, 0.010, 5)  # 10 ms steps: a 1 ms window
    _loop(slow, clock, 0.500, 5)  # 500 ms steps: the cap
    assert fast.window_s() == pytest.approx(SHARE * 0.010)
    assert slow.window_s() == MOST_S


def test_a_loop_faster_than_the_least_window_is_never_held(clock):
    """A loop taking a batch every 2 ms (a 0.2 ms window, under LEAST_S): a sleep would cost
    the client's threads more than the window, and the loop's throughput with it."""
    q = Quiet()
    _loop(q, clock, 0.002, 10)
    assert SHARE * 0.002 < LEAST_S and q.window_s() == 0
    q.taken()
    q.hold(lambda: True)
    assert clock.slept == []


def test_a_background_thread_waits_out_the_rest_of_the_window(clock):
    q = Quiet()
    _loop(q, clock, 0.040, 4)
    q.taken()  # the loop takes a batch now, and dispatches
    clock.now += 0.001  # the fetch thread wakes 1 ms into the dispatch window
    q.hold(lambda: True)
    assert clock.slept == [pytest.approx(q.window_s() - 0.001)]
    q.hold(lambda: True)  # past the window: no more waiting
    assert len(clock.slept) == 1


def test_a_loop_with_no_batch_queued_is_never_kept_waiting(clock):
    q = Quiet()
    _loop(q, clock, 0.040, 4)
    q.taken()
    q.hold(lambda: False)  # the loop waits for this very batch
    assert clock.slept == []


def test_the_interval_follows_a_loop_that_slows_down(clock):
    q = Quiet()
    _loop(q, clock, 0.008, 10)
    before = q.window_s()
    _loop(q, clock, 0.020, 10)
    assert before == pytest.approx(SHARE * 0.008)
    assert SHARE * 0.008 < q.window_s() <= SHARE * 0.020
