"""The set-up gate: free within the grace, then one request at a time at its share of the CPU,
refused past its budget or past the queue's bound, and left by a client that goes."""

from __future__ import annotations

import threading
import time

import pytest

from input_server import cancel
from input_server.batching.pacing import Gate, PaceConfig
from input_server.errors import CancelledError, OverBudgetError


def _spin(pace, cpu_s: float) -> None:
    """`cpu_s` of this thread's CPU in small units, `pace` called between them."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pace()
        sum(range(2000))


def test_work_within_the_grace_is_not_paced():
    gate = Gate(PaceConfig(grace_s=0.5, share=0.01))
    start = time.monotonic()
    with gate.work("x") as pace:
        _spin(pace, 0.05)
    assert time.monotonic() - start < 2.0  # at a 1 % share, 5 s


def test_work_past_the_grace_runs_at_its_share():
    gate = Gate(PaceConfig(grace_s=0.0, share=0.2, slice_s=0.002))
    start = time.monotonic()
    with gate.work("x") as pace:
        _spin(pace, 0.1)
    assert time.monotonic() - start >= 0.1 / 0.2 * 0.8  # 0.5 s at 20 %, unpaced 0.1 s


def test_work_past_its_budget_is_refused_before_the_next_unit():
    gate = Gate(PaceConfig(grace_s=1.0, budget_s=0.05))
    with gate.work("reading the thing") as pace, pytest.raises(OverBudgetError) as e:
        _spin(pace, 0.5)
    assert "reading the thing took over 0.05 s of the server's CPU" in str(e.value)


def test_paced_requests_take_turns_and_the_queue_is_bounded():
    gate = Gate(PaceConfig(grace_s=0.0, share=1.0, max_waiting=1))
    order, holding, release = [], threading.Event(), threading.Event()

    def first():
        with gate.work("a") as pace:
            pace()
            order.append("a")
            holding.set()
            release.wait(10)

    def second():
        with gate.work("b") as pace:
            pace()
            order.append("b")

    a = threading.Thread(target=first)
    a.start()
    assert holding.wait(10)
    b = threading.Thread(target=second)
    b.start()
    time.sleep(0.3)  # b waits its turn
    with gate.work("c") as pace, pytest.raises(OverBudgetError, match="1 requests already wait"):
        pace()
    release.set()
    a.join(10)
    b.join(10)
    assert order == ["a", "b"]


def test_a_client_that_leaves_gives_its_place_up():
    gate = Gate(PaceConfig(grace_s=0.0, share=1.0))
    left, holding, release = threading.Event(), threading.Event(), threading.Event()
    got = []

    def holder():
        with gate.work("a") as pace:
            pace()
            holding.set()
            release.wait(10)

    def waiter():
        with cancel.scope(left), gate.work("b") as pace:
            try:
                pace()
            except CancelledError as e:
                got.append(e)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert holding.wait(10)
    threads.append(threading.Thread(target=waiter))
    threads[1].start()
    time.sleep(0.2)
    left.set()
    threads[1].join(5)
    assert got and not threads[1].is_alive()
    release.set()
    threads[0].join(10)
    with gate.work("c") as pace:  # the queue is empty again: c goes at once
        pace()
