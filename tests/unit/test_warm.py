"""Grain loaded behind the socket (`serving/warm.py`): etils' lazy imports made the loading
thread's alone, put back as they were, and a load that fails still lets streams go on."""

from __future__ import annotations

import builtins
import contextlib
import sys
import threading
import types

import pytest

from input_server.serving import warm

MARK = object()


def lazy_import(
    name, globals_=None, locals_=None, fromlist=(), level=0, *, error_callback, success_callback
):  # noqa: E501 - etils' own signature
    return MARK


def _import_on_another_thread(name: str):
    got = []
    t = threading.Thread(target=lambda: got.append(builtins.__import__(name)))
    t.start()
    t.join()
    return got[0]


def test_lazy_imports_serve_only_the_thread_inside_the_block():
    original = contextlib.nullcontext
    epy = types.SimpleNamespace(lazy_imports=original)
    real = builtins.__import__
    with warm._lazy_here(epy, lazy_import):
        assert epy.lazy_imports is not original
        with epy.lazy_imports():
            assert builtins.__import__("json") is MARK  # this thread: lazy
            assert _import_on_another_thread("json") is sys.modules["json"]  # others: real
        assert builtins.__import__ is real
    assert epy.lazy_imports is original


def test_what_was_swapped_is_put_back_after_an_error_and_not_over_a_later_swap():
    epy = types.SimpleNamespace(lazy_imports=contextlib.nullcontext)
    real = builtins.__import__
    with pytest.raises(RuntimeError), warm._lazy_here(epy, lazy_import), epy.lazy_imports():
        raise RuntimeError("the import failed")
    assert builtins.__import__ is real and epy.lazy_imports is contextlib.nullcontext
    # Another swap came between: it stays (the block's own lazy import no longer serves).
    other = lambda *a, **k: real(*a, **k)  # noqa: E731
    try:
        with warm._lazy_here(epy, lazy_import), epy.lazy_imports():
            dispatch = builtins.__import__
            builtins.__import__ = other
        assert builtins.__import__ is other
        assert dispatch("json") is sys.modules["json"]  # after its block: the real import
    finally:
        builtins.__import__ = real


def test_etils_lazy_import_is_found_only_with_the_signature_it_is_called_with(monkeypatch):
    found = warm._etils_lazy()
    assert found is not None, "the installed etils no longer has what _lazy_here builds on"
    epy, fn = found
    module = sys.modules[epy.lazy_imports.__module__]
    assert fn is module._lazy_import
    monkeypatch.setattr(module, "_lazy_import", lambda name, *args: None)
    assert warm._etils_lazy() is None  # the server then loads Grain before it answers
    monkeypatch.delattr(module, "_lazy_import")
    assert warm._etils_lazy() is None


def test_a_load_that_fails_still_ends(monkeypatch):
    monkeypatch.delitem(sys.modules, "grain", raising=False)
    calls = []

    def failing_load():
        calls.append(threading.current_thread().name)
        raise ImportError("no grain here")

    monkeypatch.setattr(warm, "load", failing_load)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    assert warm.load_behind()
    assert warm.wait_loaded(10), "streams would wait for a load that ended in an error"
    assert calls == ["load-grain"]
