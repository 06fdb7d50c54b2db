"""The token cache's file digests (`data/token_cache_digest.py`) on real files and a real cache
database: remembered by identity, read again after a same-size same-mtime rewrite, not taken
of a file changed within the racy window, and a changed file noticed."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from input_server.data import token_cache_digest as d
from input_server.data.token_cache import TokenCache


def _aged(path, text: bytes) -> str:
    """`text` in `path`, then waited for until its ctime is past the racy window."""
    with open(path, "wb") as f:
        f.write(text)
    time.sleep(max(0.0, (os.stat(path).st_ctime_ns + d.RACY_NS - time.time_ns()) / 1e9))
    return os.fspath(path)


def _rewrite_keeping_size_and_mtime(path: str, text: bytes) -> None:
    st = os.stat(path)
    assert len(text) == st.st_size
    with open(path, "r+b") as f:
        f.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def cache(tmp_path):
    c = TokenCache(str(tmp_path / "cache"), 1 << 20)
    yield c
    c.close()


def test_a_digest_is_remembered_and_a_rewrite_is_read_again(tmp_path, cache):
    path = _aged(tmp_path / "a.jsonl", b"old text\n")
    (state,) = d.file_states(cache, [path])
    assert state.digest == hashlib.sha256(b"old text\n").digest()
    assert cache.digests([state.identity]) == [state.digest]  # remembered for its identity
    _rewrite_keeping_size_and_mtime(path, b"new text\n")
    (again,) = d.file_states(cache, [path])
    assert again.identity[2:4] == state.identity[2:4]  # same size and mtime
    assert again.digest == hashlib.sha256(b"new text\n").digest()
    assert cache.digests([state.identity]) == [None]  # the inode's old row replaced


def test_a_remembered_digest_is_not_read_again(tmp_path, cache):
    path = _aged(tmp_path / "a.jsonl", b"some text\n")
    (state,) = d.file_states(cache, [path])
    # Another process's cache object finds it by the file's identity, reading no byte: the
    # stored digest, planted here as a marker, is what comes back.
    cache.remember_digests([(state.identity, b"marker")])
    other = TokenCache(cache.folder, 1 << 20)
    (found,) = d.file_states(other, [path])
    other.close()
    assert found.digest == b"marker"


def test_a_file_changed_within_the_racy_window_is_waited_for(tmp_path, cache):
    path = tmp_path / "fresh.jsonl"
    path.write_bytes(b"just written\n")
    changed_ns = os.stat(path).st_ctime_ns
    d.file_states(cache, [str(path)])
    # Not digested before its ctime was RACY_NS old: a later write in the same clock tick
    # would otherwise leave the remembered identity as it was.
    assert time.time_ns() - changed_ns >= d.RACY_NS


def test_a_file_that_keeps_changing_is_refused(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(d, "SETTLE_S", 0.5)
    path = tmp_path / "busy.jsonl"
    path.write_bytes(b"0\n")
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            os.utime(path)  # a change every 50 ms: never RACY_NS old
            time.sleep(0.05)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        with pytest.raises(d.Unsettled, match="changed less than"):
            d.file_states(cache, [str(path)])
    finally:
        stop.set()
        writer.join()


def test_source_files_notice_a_rewrite_and_stay_off(tmp_path, cache):
    path = _aged(tmp_path / "a.jsonl", b"old text\n")
    files = d.SourceFiles(d.file_states(cache, [path]))
    assert files.unchanged()
    _rewrite_keeping_size_and_mtime(path, b"new text\n")
    assert files.unchanged(every_s=60.0)  # trusted: checked less than a minute ago
    assert not files.unchanged()
    assert files.changed == path
    _rewrite_keeping_size_and_mtime(path, b"old text\n")
    assert not files.unchanged()  # off for good: its readers may hold either text
