"""The set-up gate: free within the grace, then one request at a time at its share of the CPU,
refused past its budget or past the queue's bound, and left by a client that goes; its queue
fair between peers, and between the clients of one peer: a flood from one neither keeps
another's request out nor puts it behind the flood."""

from __future__ import annotations

import threading
import time

import pytest

from input_server import cancel
from input_server.batching.pacing import Gate, PaceConfig, caller
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
    with gate.work("c") as pace, pytest.raises(OverBudgetError) as e:
        pace()
    assert "c: the server's set-up queue is full (1 request waiting" in str(e.value)
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


class _Request:
    """A request of `key` on its own thread: it takes its turn (appending its name to `order`),
    then holds it until `release` is set; `error` is what refused it."""

    def __init__(self, gate: Gate, key, name: str, order: list, release: threading.Event):
        self.name, self.error = name, None
        self.turn = threading.Event()
        self._args = gate, key, order, release
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        gate, key, order, release = self._args
        try:
            with caller(lambda: key), gate.work(self.name) as pace:
                pace()
                order.append(self.name)
                self.turn.set()
                release.wait(10)
        except OverBudgetError as e:
            self.error = e

    def start(self, gate: Gate, waiting: int | None) -> _Request:
        """Starts it; returns once `waiting` requests wait (None: once it holds the turn)."""
        self.thread.start()
        if waiting is None:
            assert self.turn.wait(10), self.name
        else:
            _until(lambda: gate.waiting == waiting, self.name)
        return self


def _until(done, what: str) -> None:
    end = time.monotonic() + 10
    while not done():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def _released(requests) -> None:
    for r in requests:
        r.thread.join(10)
        assert not r.thread.is_alive(), r.name


@pytest.mark.parametrize(
    "flood, other",
    [
        (("ipv4:10.0.0.1", "ipv4:10.0.0.1:1000"), ("ipv4:10.0.0.2", "ipv4:10.0.0.2:2000")),
        # Unix-socket peers all read `unix:`: the client each names tells them apart.
        (("unix", "client a"), ("unix", "client b")),
    ],
    ids=["another-host", "another-client-of-one-unix-peer"],
)
def test_a_flood_from_one_peer_cannot_keep_another_request_out(flood, other):
    gate = Gate(PaceConfig(grace_s=0.0, share=1.0, max_waiting=4))
    order, release = [], threading.Event()
    made = [_Request(gate, flood, "f0", order, release).start(gate, None)]
    for i in range(1, 5):  # every waiting place the flood's
        made.append(_Request(gate, flood, f"f{i}", order, release).start(gate, i))
    refused = _Request(gate, flood, "f5", order, release)
    refused.thread.start()
    refused.thread.join(10)
    assert "set-up queue is full (4 requests waiting" in str(refused.error), refused.error
    # Another's request takes the flood's newest place, and the next turn.
    made.append(_Request(gate, other, "o", order, release).start(gate, 4))
    _until(lambda: made[4].error is not None, "the flood's newest place given up")
    assert "gave its place to one of a peer (or client) holding fewer" in str(made[4].error)
    release.set()
    _released(made)
    assert order == ["f0", "o", "f1", "f2", "f3"], order


def test_turns_rotate_between_peers_and_then_between_each_peers_clients():
    gate = Gate(PaceConfig(grace_s=0.0, share=1.0, max_waiting=8))
    order, release = [], threading.Event()
    arrivals = [
        (("a", "1"), "a1"),  # holds the turn as the others come
        (("a", "1"), "a1-2"),
        (("a", "1"), "a1-3"),
        (("a", "2"), "a2"),
        (("b", "1"), "b1"),
        (("b", "1"), "b1-2"),
        (("c", "1"), "c1"),
    ]
    holder, *rest = [_Request(gate, k, n, order, release) for k, n in arrivals]
    holder.start(gate, None)
    for i, r in enumerate(rest, 1):
        r.start(gate, i)
    release.set()
    _released([holder, *rest])
    # Peer by peer (the one served longest ago first: b and c were never served), and within
    # peer a, client 2 before client 1's next.
    assert order == ["a1", "b1", "c1", "a2", "b1-2", "a1-2", "a1-3"], order


def test_equal_peers_never_take_places_from_each_other():
    """A full queue of one request from each of many peers (a flood spread over many hosts,
    or over made-up client names) refuses a newcomer rather than churn: it would take the
    place of an honest request as soon as of a flood's."""
    gate = Gate(PaceConfig(grace_s=0.0, share=1.0, max_waiting=3))
    order, release = [], threading.Event()
    made = [_Request(gate, ("p0", ""), "p0", order, release).start(gate, None)]
    for i in range(1, 4):
        made.append(_Request(gate, (f"p{i}", ""), f"p{i}", order, release).start(gate, i))
    late = _Request(gate, ("p9", ""), "p9", order, release)
    late.thread.start()
    late.thread.join(10)
    assert "set-up queue is full" in str(late.error), late.error
    release.set()
    _released(made)
    assert order == ["p0", "p1", "p2", "p3"] and all(r.error is None for r in made)
