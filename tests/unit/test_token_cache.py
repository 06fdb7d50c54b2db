"""The token cache: round trips, restarts, damaged entries and files, LRU eviction within the
bound, threads and spawned processes at once, pickling."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import sqlite3
import stat
import threading
import time
import zlib

import numpy as np
import pytest

from input_server.data import token_cache
from input_server.data.token_cache import DB_NAME, TokenCache


def ids_for(key: bytes, n: int | None = None) -> np.ndarray:
    """Ids that depend on the key alone, so any reader can check what it got."""
    seed = int.from_bytes(key[-4:].rjust(4, b"\0"), "little")
    n = 1 + seed % 700 if n is None else n
    return np.random.default_rng(seed).integers(0, 2**31 - 1, n, dtype=np.int32)


def db(folder) -> sqlite3.Connection:
    return sqlite3.connect(os.path.join(folder, DB_NAME), isolation_level=None)


def size(key: bytes, ids: np.ndarray) -> int:
    return 4 * ids.size + len(key)  # what the bound counts for one entry


@pytest.fixture
def cache(tmp_path):
    c = TokenCache(str(tmp_path / "cache"), max_bytes=1 << 30)
    yield c
    c.close()


def test_round_trip_misses_and_namespaces(cache):
    keys = [b"doc-%d" % i for i in range(40)]
    want = [ids_for(k) for k in keys]
    want[3] = np.zeros(0, np.int32)  # an empty document
    cache.put_many("tok-a", keys, want)

    got = cache.get_many("tok-a", keys + [b"never-put"])
    for w, g in zip(want, got[:-1], strict=True):
        assert g.dtype == np.int32
        np.testing.assert_array_equal(g, w)
    assert got[3].shape == (0,)
    assert got[-1] is None
    assert cache.get_many("tok-b", keys[:5]) == [None] * 5  # another namespace: nothing
    assert cache.get_many("tok-a", []) == []
    s = cache.stats()
    assert (s["entries"], s["hits"], s["misses"], s["corrupt"]) == (40, 40, 6, 0)
    assert s["bytes"] == sum(size(k, w) for k, w in zip(keys, want, strict=True))


def test_uint32_reads_back_as_int32_and_duplicates_and_replacement(cache):
    cache.put_many("ns", [b"u"], [np.arange(10, dtype=np.uint32)])
    (got,) = cache.get_many("ns", [b"u"])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.arange(10))

    cache.put_many("ns", [b"u"], [np.arange(3, dtype=np.int32)])  # replaces, totals follow
    a, b = cache.get_many("ns", [b"u", b"u"])
    np.testing.assert_array_equal(a, [0, 1, 2])
    np.testing.assert_array_equal(b, [0, 1, 2])
    assert (cache.stats()["entries"], cache.stats()["bytes"]) == (1, 12 + 1)


@pytest.mark.parametrize(
    ("max_bytes", "ids", "message"),
    [
        (0, None, "got 0"),
        (-5, None, "got -5"),
        (100, np.arange(3, dtype=np.int64), "int64"),
        (100, np.arange(3, dtype=np.float32), "float32"),
    ],
    ids=["zero-bound", "negative-bound", "int64-ids", "float-ids"],
)
def test_refuses(tmp_path, max_bytes, ids, message):
    with pytest.raises(ValueError, match=message):
        c = TokenCache(str(tmp_path / "c"), max_bytes=max_bytes)
        c.put_many("ns", [b"k"], [ids])


def test_folder_is_private_and_nothing_is_written_outside_it(tmp_path):
    folder = tmp_path / "a" / "cache"
    c = TokenCache(str(folder), max_bytes=10_000)
    c.put_many("../../escape", [b"/etc/passwd"], [np.arange(5, dtype=np.int32)])
    assert c.get_many("../../escape", [b"/etc/passwd"])[0] is not None
    assert stat.S_IMODE(os.stat(folder).st_mode) & 0o077 == 0
    c.close()
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["a", "cache", *(p.name for p in folder.iterdir())]
    )
    allowed = {DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm", "tokens.lock"}
    assert {p.name for p in folder.iterdir()} <= allowed


def test_a_restart_reads_what_was_stored(tmp_path):
    folder = str(tmp_path / "cache")
    keys = [b"k%d" % i for i in range(10)]
    first = TokenCache(folder, max_bytes=1 << 20)
    first.put_many("ns", keys, [ids_for(k) for k in keys])
    beside = TokenCache(folder, max_bytes=1 << 20)  # another process's view, still open
    assert all(g is not None for g in beside.get_many("ns", keys))
    first.close()
    beside.close()

    again = TokenCache(folder, max_bytes=1 << 20)
    for k, g in zip(keys, again.get_many("ns", keys), strict=True):
        np.testing.assert_array_equal(g, ids_for(k))
    assert again.stats()["entries"] == 10


def _flip_blob(blob: bytes, crc: int) -> tuple[bytes, int]:
    return bytes([blob[0] ^ 0xFF]) + blob[1:], crc


def _flip_crc(blob: bytes, crc: int) -> tuple[bytes, int]:
    return blob, crc ^ 1


def _truncate(blob: bytes, crc: int) -> tuple[bytes, int]:
    short = blob[:-4]
    return short, zlib.crc32(short)  # a consistent checksum: only the length gives it away


@pytest.mark.parametrize("damage", [_flip_blob, _flip_crc, _truncate], ids=lambda f: f.__name__)
def test_a_damaged_entry_is_a_miss_and_is_rebuilt(cache, damage):
    keys = [b"a", b"b", b"c"]
    cache.put_many("ns", keys, [ids_for(k, 50) for k in keys])
    con = db(cache.folder)
    blob, crc = con.execute("SELECT ids, crc FROM tokens WHERE key = ?", (b"b",)).fetchone()
    con.execute("UPDATE tokens SET ids = ?, crc = ? WHERE key = ?", (*damage(blob, crc), b"b"))

    a, b, c = cache.get_many("ns", keys)
    assert b is None
    np.testing.assert_array_equal(a, ids_for(b"a", 50))
    np.testing.assert_array_equal(c, ids_for(b"c", 50))
    assert cache.stats()["corrupt"] == 1
    assert con.execute("SELECT count(*) FROM tokens WHERE key = ?", (b"b",)).fetchone() == (0,)
    assert cache.stats()["bytes"] == 2 * size(b"a", ids_for(b"a", 50))  # totals kept right

    cache.put_many("ns", [b"b"], [ids_for(b"b", 50)])
    np.testing.assert_array_equal(cache.get_many("ns", [b"b"])[0], ids_for(b"b", 50))
    assert cache.stats()["corrupt"] == 1
    con.close()


def test_a_garbage_database_file_becomes_an_empty_cache(tmp_path, caplog):
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / DB_NAME).write_bytes(b"this is not a sqlite database\n" * 200)
    c = TokenCache(str(folder), max_bytes=1 << 20)
    with caplog.at_level(logging.WARNING, logger="input_server.data.token_cache"):
        assert c.get_many("ns", [b"k"]) == [None]
    assert "damaged" in caplog.text
    c.put_many("ns", [b"k"], [np.arange(7, dtype=np.int32)])
    np.testing.assert_array_equal(c.get_many("ns", [b"k"])[0], np.arange(7))
    c.close()


def _cut_in_half(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def _overwrite(name: str):
    """Damages the root page of table `name`: the file opens, and the first statement that
    goes through the table finds the damage (reads go through `tokens`; only writes, such as
    recording hits, through `recency`)."""

    def damage(path: str) -> None:
        con = sqlite3.connect(path)
        (page,) = con.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = ?", (name,)
        ).fetchone()
        (page_size,) = con.execute("PRAGMA page_size").fetchone()
        con.close()
        with open(path, "r+b") as f:
            f.seek((page - 1) * page_size)
            f.write(np.random.default_rng(0).bytes(page_size))

    damage.__name__ = f"_overwrite_{name}"
    return damage


@pytest.mark.parametrize(
    ("damage", "found_by"),
    [(_cut_in_half, "get"), (_overwrite("tokens"), "get"), (_overwrite("recency"), "put")],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_a_damaged_database_file_is_replaced(tmp_path, caplog, damage, found_by):
    folder = str(tmp_path / "cache")
    keys = [b"k%04d" % i for i in range(300)]
    c = TokenCache(folder, max_bytes=1 << 30)
    c.put_many("ns", keys, [ids_for(k) for k in keys])
    c.close()  # checkpoints the WAL into the file, then removes it
    damage(os.path.join(folder, DB_NAME))

    c = TokenCache(folder, max_bytes=1 << 30)
    with caplog.at_level(logging.WARNING, logger="input_server.data.token_cache"):
        got = c.get_many("ns", keys)
        assert ("damaged" in caplog.text) == (found_by == "get")
        for k, g in zip(keys, got, strict=True):
            assert g is None or np.array_equal(g, ids_for(k))
        c.put_many("ns", keys[:5], [ids_for(k) for k in keys[:5]])  # records the hits first
    assert "damaged" in caplog.text
    for k, g in zip(keys[:5], c.get_many("ns", keys[:5]), strict=True):
        np.testing.assert_array_equal(g, ids_for(k))
    assert c.stats()["entries"] >= 5
    c.close()


def test_eviction_drops_the_least_recently_used(tmp_path):
    one = size(b"k0", np.zeros(100, np.int32))
    c = TokenCache(str(tmp_path / "cache"), max_bytes=5 * one)
    for i in range(5):  # one put each: k0 is the oldest, k4 the newest
        c.put_many("ns", [b"k%d" % i], [np.full(100, i, np.int32)])
    assert c.get_many("ns", [b"k0"])[0] is not None  # read: k0 now the most recent, k1 oldest

    c.put_many("ns", [b"k5"], [np.full(100, 5, np.int32)])
    con = db(c.folder)
    left = {k for (k,) in con.execute("SELECT key FROM tokens")}
    assert left == {b"k0", b"k2", b"k3", b"k4", b"k5"}
    assert c.stats()["bytes"] == 5 * one

    c.put_many("ns", [b"k6", b"k7"], [np.full(100, 6, np.int32)] * 2)
    left = {k for (k,) in con.execute("SELECT key FROM tokens")}
    assert left == {b"k0", b"k4", b"k5", b"k6", b"k7"}
    con.close()
    c.close()


def test_hits_are_recorded_in_batches_that_other_processes_see(tmp_path, monkeypatch):
    one = size(b"k0", np.zeros(100, np.int32))
    folder = str(tmp_path / "cache")
    reader, writer = TokenCache(folder, 5 * one), TokenCache(folder, 5 * one)  # two processes
    for i in range(5):
        writer.put_many("ns", [b"k%d" % i], [np.full(100, i, np.int32)])
    con = db(folder)

    def left() -> set[bytes]:
        return {k for (k,) in con.execute("SELECT key FROM tokens")}

    (before,) = con.execute("PRAGMA data_version").fetchone()  # changes with others' commits
    assert reader.get_many("ns", [b"k0"])[0] is not None
    assert con.execute("PRAGMA data_version").fetchone() == (before,)  # a hit writes nothing
    monkeypatch.setattr(token_cache, "_RECORD_AFTER_S", 0.0)
    assert reader.get_many("ns", [b"k2"])[0] is not None  # due: k0 and k2 recorded together
    assert con.execute("PRAGMA data_version").fetchone() != (before,)

    writer.put_many("ns", [b"k5"], [np.full(100, 5, np.int32)])
    assert left() == {b"k0", b"k2", b"k3", b"k4", b"k5"}  # k1: the oldest not read
    monkeypatch.setattr(token_cache, "_RECORD_AFTER_S", 3600.0)
    assert reader.get_many("ns", [b"k3"])[0] is not None
    reader.close()  # records k3
    writer.put_many("ns", [b"k6"], [np.full(100, 6, np.int32)])
    assert left() == {b"k0", b"k2", b"k3", b"k5", b"k6"}
    assert writer.stats()["bytes"] == 5 * one
    con.close()
    writer.close()


def test_a_get_does_not_wait_for_another_writer(tmp_path, monkeypatch):
    c = TokenCache(str(tmp_path / "cache"), max_bytes=1 << 20)
    c.put_many("ns", [b"a", b"b"], [np.arange(3, dtype=np.int32)] * 2)
    con = db(c.folder)

    def used() -> dict[bytes, int]:
        rows = con.execute("SELECT key, used FROM tokens JOIN recency USING (id)")
        return dict(rows.fetchall())

    first = used()
    monkeypatch.setattr(token_cache, "_RECORD_AFTER_S", 0.0)
    con.execute("BEGIN IMMEDIATE")  # another process writing: the hit waits, not the get
    start = time.monotonic()
    assert c.get_many("ns", [b"a"])[0] is not None
    assert time.monotonic() - start < 5  # well within the 30 s busy timeout
    con.execute("COMMIT")
    assert used() == first

    assert c.get_many("ns", [b"b"])[0] is not None  # the lock is free: a and b recorded
    now = used()
    assert now[b"a"] == now[b"b"] > first[b"a"]
    monkeypatch.setattr(token_cache, "_RECORD_AFTER_S", 3600.0)
    monkeypatch.setattr(token_cache, "_RECORD_AT", 2)  # or once enough entries wait
    c.get_many("ns", [b"a"])
    assert used() == now
    c.get_many("ns", [b"b"])
    assert used()[b"a"] == used()[b"b"] > now[b"a"]
    con.close()
    c.close()


def test_a_file_of_an_older_layout_starts_empty(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    con = db(folder)  # the first layout: recency in the rows holding the ids
    con.execute(
        "CREATE TABLE tokens (namespace TEXT, key BLOB, ids BLOB, n INTEGER, crc INTEGER, "
        "used INTEGER, PRIMARY KEY (namespace, key))"
    )
    con.execute("INSERT INTO tokens VALUES ('ns', x'6b', x'01000000', 1, 0, 1)")
    con.close()
    c = TokenCache(str(folder), max_bytes=1 << 20)
    assert c.get_many("ns", [b"k"]) == [None]
    c.put_many("ns", [b"k"], [np.arange(3, dtype=np.int32)])
    np.testing.assert_array_equal(c.get_many("ns", [b"k"])[0], np.arange(3))
    assert (c.stats()["entries"], c.stats()["bytes"]) == (1, 12 + 1)
    c.close()


def test_the_total_stays_within_the_bound(tmp_path):
    bound = 20_000
    c = TokenCache(str(tmp_path / "cache"), max_bytes=bound)
    rng = np.random.default_rng(0)
    for step in range(40):
        keys = [b"s%d-%d" % (step, j) for j in range(int(rng.integers(1, 12)))]
        c.put_many("ns", keys, [ids_for(k) for k in keys])
        assert 0 < c.stats()["bytes"] <= bound
    con = db(c.folder)
    (counted,) = con.execute("SELECT sum(length(ids) + length(key)) FROM tokens").fetchone()
    assert counted == c.stats()["bytes"]  # the running total matches the table
    con.close()
    c.close()


def _use(cache: TokenCache, seed: int, rounds: int) -> int:
    """Puts and gets overlapping keys; every hit must be the exact ids of its key."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(rounds):
        keys = [b"shared-%d" % i for i in rng.choice(400, size=64, replace=False)]
        for k, g in zip(keys, cache.get_many("ns", keys), strict=True):
            if g is not None:
                assert np.array_equal(g, ids_for(k)), k
                hits += 1
        misses = keys[::2]
        cache.put_many("ns", misses, [ids_for(k) for k in misses])
    return hits


def _worker(args: tuple[TokenCache, int]) -> int:
    cache, seed = args
    return _use(cache, seed, rounds=40)


def test_spawned_processes_at_once(tmp_path):
    # A bound below the keys' total, so evictions run beside the reads.
    cache = TokenCache(str(tmp_path / "cache"), max_bytes=300_000)
    cache.put_many("ns", [b"shared-1"], [ids_for(b"shared-1")])  # used before it is pickled
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        hits = pool.map(_worker, [(cache, seed) for seed in range(3)], chunksize=1)
    assert all(h > 0 for h in hits)
    assert 0 < cache.stats()["bytes"] <= 300_000
    cache.close()


def test_threads_at_once(cache):
    errors = []

    def run(seed):
        try:
            _use(cache, seed, rounds=20)
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert cache.stats()["hits"] > 0


def test_a_pickled_copy_reads_the_entries(cache):
    cache.put_many("ns", [b"k"], [np.arange(9, dtype=np.int32)])
    assert cache.get_many("ns", [b"k"])[0] is not None
    assert cache.__getstate__() == {"folder": cache.folder, "max_bytes": cache.max_bytes}

    copy = pickle.loads(pickle.dumps(cache))
    np.testing.assert_array_equal(copy.get_many("ns", [b"k"])[0], np.arange(9))
    assert (copy.stats()["hits"], cache.stats()["hits"]) == (1, 1)  # counters are per object
    copy.close()
