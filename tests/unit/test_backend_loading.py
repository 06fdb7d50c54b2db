"""Loading a backend once a model (`route.Router.loaded_backend`): a load that fails leaves no
thread waiting behind it and nothing marked as loading; the next thread loads it itself."""

from __future__ import annotations

import collections
import threading

from input_server.data.tokenizers import route


class _Stub:
    """A model whose backend load blocks until `release`, failing the first time (the part of
    `route.Routed` a load asks for)."""

    def __init__(self):
        self.started, self.release, self.loads = threading.Event(), threading.Event(), 0

    def digest(self) -> str:
        return "stub"

    def load_backend(self, name: str):
        self.loads += 1
        if self.loads == 1:
            self.started.set()
            assert self.release.wait(60)
            raise RuntimeError("the first load fails")
        return object()


class _Watched:
    """A load's lock that says when a thread waits on it."""

    def __init__(self, lock):
        self.lock, self.waiting = lock, threading.Event()

    def __enter__(self):
        self.waiting.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def test_a_failed_load_leaves_no_waiter_stuck(monkeypatch):
    monkeypatch.setattr(route, "_BACKENDS", collections.OrderedDict())
    monkeypatch.setattr(route, "_LOADING", {})
    stub, got = _Stub(), {}
    router = route.Router(stub, ("fast",))

    def load(who: str) -> None:
        try:
            got[who] = router.loaded_backend("fast")
        except RuntimeError as e:
            got[who] = e

    first = threading.Thread(target=load, args=("first",), daemon=True)
    first.start()
    assert stub.started.wait(60)
    key = (_Stub, "stub", "fast")
    with route._BACKENDS_LOCK:  # to see the second thread wait on the first's load
        route._LOADING[key] = watched = _Watched(route._LOADING[key])
    second = threading.Thread(target=load, args=("second",), daemon=True)
    second.start()
    assert watched.waiting.wait(60)
    stub.release.set()
    for t in (first, second):
        t.join(60)
        assert not t.is_alive(), "a thread still waits on a load that failed"
    assert isinstance(got["first"], RuntimeError)
    assert stub.loads == 2 and got["second"] is route._BACKENDS[key]
    assert route._LOADING == {}  # nothing left marked as loading
    assert router.loaded_backend("fast") is got["second"]  # loaded once, then shared
