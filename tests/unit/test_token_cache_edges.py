"""The token cache at its edges: connections that outlive no call, a database that cannot be
read or written (not damaged: locked, full, gone) costing misses and never an error, a folder
others could write into refused, waiting hits bounded when the write lock stays taken, and
after a fork no thread finding the parent's pool."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import types

import numpy as np
import pytest

from input_server.data import token_cache, token_cache_files
from input_server.data.token_cache import DB_NAME, TokenCache


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_threads_that_end_leave_no_connection_open(tmp_path):
    # Each stream and each switch runs on new threads: a connection kept per thread stayed
    # open after it (200 threads: 400 more descriptors).
    c = TokenCache(str(tmp_path / "cache"), max_bytes=1 << 20)
    c.put_many("ns", [b"a"], [np.arange(5, dtype=np.int32)])
    before = open_fds()
    got = []

    def one() -> None:
        got.append(c.get_many("ns", [b"a", b"b"]))

    for _ in range(20):
        threads = [threading.Thread(target=one) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(got) == 200 and all(g[0] is not None and g[1] is None for g in got)
    # At most the idle connections kept for later calls (two descriptors each, with the WAL).
    assert open_fds() - before <= 3 * token_cache._IDLE_MAX
    c.close()
    assert open_fds() <= before


def test_a_locked_database_costs_misses_not_errors(tmp_path, monkeypatch, caplog):
    # Not damage: another process holds the file (as a full disk, a lost mount or a lock held
    # past the busy timeout would). Reads miss, writes are dropped, both counted, one line
    # logged; the stream never sees an sqlite error.
    monkeypatch.setattr(token_cache_files, "BUSY_TIMEOUT_S", 0.2)
    folder = str(tmp_path / "cache")
    c = TokenCache(folder, max_bytes=1 << 20)
    c.put_many("ns", [b"a"], [np.arange(5, dtype=np.int32)])
    c.close()  # its next call opens a connection with the short timeout
    other = sqlite3.connect(os.path.join(folder, DB_NAME), isolation_level=None)
    other.execute("PRAGMA locking_mode = EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    other.execute("DELETE FROM tokens WHERE 0")
    try:
        start = time.monotonic()
        assert c.get_many("ns", [b"a", b"b"]) == [None, None]
        c.put_many("ns", [b"b"], [np.arange(3, dtype=np.int32)])
        c.put_many("ns", [b"c"], [np.arange(3, dtype=np.int32)])
        assert time.monotonic() - start < 10
    finally:
        other.execute("COMMIT")
        other.close()
    counts = c.stats()
    assert (counts["failed_gets"], counts["failed_puts"], counts["misses"]) == (1, 2, 2)
    warned = [r.getMessage() for r in caplog.records if "could not" in r.getMessage()]
    assert len(warned) == 2 and folder in warned[0]  # the first read and the first write
    got = c.get_many("ns", [b"a", b"b"])  # free again: what was stored reads back
    np.testing.assert_array_equal(got[0], np.arange(5))
    assert got[1] is None
    c.close()


def test_a_folder_others_can_write_into_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match=r"mode 777: others can write"):
        TokenCache(str(shared), max_bytes=1 << 20)
    assert not (shared / DB_NAME).exists()

    if os.geteuid() == 0:  # only root can give a folder to another user
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        with pytest.raises(ValueError, match=r"belongs to user 65534"):
            TokenCache(str(theirs), max_bytes=1 << 20)

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / DB_NAME).symlink_to(tmp_path / "elsewhere.sqlite3")
    with pytest.raises(ValueError, match=r"is a symbolic link"):
        TokenCache(str(linked), max_bytes=1 << 20)
    assert not (tmp_path / "elsewhere.sqlite3").exists()


def test_waiting_hits_are_forgotten_not_waited_on_when_the_lock_stays_taken(tmp_path, monkeypatch):
    c = TokenCache(str(tmp_path / "cache"), max_bytes=1 << 20)
    c.put_many("ns", [b"a", b"b"], [np.arange(3, dtype=np.int32)] * 2)
    monkeypatch.setattr(token_cache, "_RECORD_AFTER_S", 3600.0)
    monkeypatch.setattr(token_cache, "_RECORD_AT", 2)
    other = sqlite3.connect(os.path.join(c.folder, DB_NAME), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a writer that keeps the lock
    try:
        start = time.monotonic()
        for _ in range(3):
            assert c.get_many("ns", [b"a", b"b"])[0] is not None  # full at once
        assert time.monotonic() - start < 5  # not the 30 s busy timeout, three times
        assert c._n_waiting == 0  # forgotten: memory stays bounded
    finally:
        other.execute("COMMIT")
        other.close()
    c.close()


def test_after_a_fork_no_thread_finds_the_parents_pool_under_its_own_pid(tmp_path, monkeypatch):
    # A child of a fork starts its pool anew on first use (`_start`). Another thread of the
    # child running midway must see the parent's pid (and start anew itself) or find the new
    # lock and pool: never this pid beside the parent's lock (held for good if a parent's
    # thread held it at the fork) or its connections (which must not cross a fork).
    c = TokenCache(str(tmp_path / "cache"), max_bytes=1 << 20)
    c.put_many("ns", [b"a"], [np.arange(5, dtype=np.int32)])
    parent_lock, parent_idle = c._lock, c._idle
    assert parent_idle  # the connection the put gave back
    c._pid = -1  # as the object stands in a child of a fork
    seen, real_lock = [], threading.Lock

    def lock():  # `_start` making the child's lock: what another thread would find now
        restarts = c._pid != os.getpid()
        seen.append(restarts or (c._lock is not parent_lock and c._idle is not parent_idle))
        return real_lock()

    monkeypatch.setattr(token_cache, "threading", types.SimpleNamespace(Lock=lock))
    np.testing.assert_array_equal(c.get_many("ns", [b"a"])[0], np.arange(5))
    assert seen == [True]
    assert c._idle is not parent_idle and c._lock is not parent_lock
    for conn in parent_idle:  # abandoned by the "child"; this test's own to close
        conn.close()
    c.close()
