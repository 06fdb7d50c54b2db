"""The one bounded prefetcher: order, backpressure, errors after the items before them, stop."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from input_client.threads import Prefetcher


def drain(p: Prefetcher) -> list:
    out = []
    while True:
        try:
            out.append(p.get(timeout=10))
        except StopIteration:
            return out


def test_items_come_in_order_then_the_end():
    p = Prefetcher(lambda put: [put(i) for i in range(100)], depth=3, name="t")
    assert drain(p) == list(range(100))
    with pytest.raises(StopIteration):  # and stays ended
        p.get(timeout=1)


def test_the_producers_error_comes_after_the_items_it_put():
    def produce(put):
        put(1)
        put(2)
        raise KeyError("boom")

    p = Prefetcher(produce, depth=4, name="t")
    assert p.get(timeout=10) == 1 and p.get(timeout=10) == 2
    with pytest.raises(KeyError, match="boom"):
        p.get(timeout=10)


def test_the_queue_is_bounded_and_stop_unblocks_a_waiting_put():
    put_results, done = [], threading.Event()

    def produce(put):
        for i in range(10):
            ok = put(i)
            put_results.append(ok)
            if not ok:
                break
        done.set()

    p = Prefetcher(produce, depth=2, name="t")
    time.sleep(0.3)
    assert put_results == [True, True]  # the third put waits for room
    p.stop()
    assert done.wait(5) and put_results[-1] is False  # ...and gives up once stopped
    p.join(5)
    assert not p.is_alive()


def test_get_times_out_with_queue_empty_and_close_frees_what_was_queued():
    release = threading.Event()

    def produce(put):
        put("a")
        release.wait(10)

    p = Prefetcher(produce, depth=4, name="t")
    assert p.get(timeout=10) == "a"
    with pytest.raises(queue.Empty):
        p.get(timeout=0.1)
    release.set()
    p.close(timeout=5)
    assert not p.is_alive()
    with pytest.raises(StopIteration):
        p.get(timeout=1)


def test_the_thread_is_named_and_a_daemon():
    release = threading.Event()
    p = Prefetcher(lambda put: release.wait(10), depth=1, name="my-fetch")
    (t,) = [t for t in threading.enumerate() if t.name == "my-fetch"]
    assert t.daemon
    release.set()
    p.close()


def test_a_get_waiting_without_timeout_ends_when_another_thread_stops_it():
    release = threading.Event()
    p = Prefetcher(lambda put: release.wait(10), depth=2, name="t")
    outcome: list = []

    def consume():
        try:
            p.get()
        except StopIteration:
            outcome.append("ended")

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(0.2)  # the get is waiting
    p.stop()
    consumer.join(5)
    assert outcome == ["ended"]
    release.set()
    p.close(timeout=5)


def test_items_taken_free_room_for_exactly_as_many_more():
    put_results: list = []
    p = Prefetcher(lambda put: [put_results.append(put(i)) for i in range(6)], depth=2, name="t")
    time.sleep(0.2)
    assert len(put_results) == 2  # full: the third put waits
    assert p.get(timeout=5) == 0
    time.sleep(0.2)
    assert len(put_results) == 3 and p.queued() == 2  # one taken, one more put, no more
    assert drain(p) == [1, 2, 3, 4, 5]
