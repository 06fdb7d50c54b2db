"""Each document's token ids kept on disk (sqlite), so later epochs and restarts skip tokenizing.

One database file serves every thread and worker process at once: sqlite's WAL lets readers
run beside one writer, and the busy timeout makes writers queue rather than fail. A damaged
entry is a miss (the caller tokenizes again and puts it back); a damaged file is replaced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import zlib

import numpy as np

from input_server.data import token_cache_sql as sql
from input_server.data.token_cache_files import (
    BUSY_TIMEOUT_S,
    DB_NAME,
    Conn,
    check_folder,
    file_lock,
    identity,
    open_db,
)

log = logging.getLogger(__name__)

_EVICT_PAGE = 1024  # rows read per step while choosing what to evict
_DTYPE = np.dtype("<i4")  # stored little-endian, so a cache folder moves between machines
# Hits wait in memory and are recorded as used together (`_record`), about once a second:
# recording each get_many's hits as it ran (a write, serialized across processes) took 2-8 ms
# of a 3-9 ms get_many of 256 documents (20-30 us a hit); batched, a hit costs 1.5-5 us.
_RECORD_AFTER_S = 1.0
_RECORD_AT = 1 << 16  # or as soon as this many entries wait (memory: a few MB)
# Connections kept open between calls. A connection a thread kept for itself outlived the
# thread: each stream's and each switch's threads left two descriptors and a page cache
# behind (200 short threads: 9 -> 409 open descriptors). Calls now borrow one.
_IDLE_MAX = 8


class TokenCache:
    """Document ids on disk, by namespace and document key, bounded in size (least recently
    used out, to within about a second: see `_record`).

    Safe to use from many threads and processes at once. Pickles as its folder and bound only:
    a copy in another process opens its own connections when first used.
    """

    def __init__(self, folder: str, max_bytes: int):
        """Args:
            folder: holds the database (created, mode 0o700, if missing); nothing is written
                outside it.
            max_bytes: the bound on the ids and keys held; least recently used entries go
                first to stay under it. The files take about a third more (sqlite's pages
                and their free space after evictions) plus the WAL (64 MiB at most after a
                checkpoint).

        Raises:
            ValueError: `max_bytes` is not positive.
        """
        if max_bytes <= 0:
            raise ValueError(
                f"`max_bytes` must be positive, got {max_bytes}; give the token cache a size "
                "or leave the cache off."
            )
        self.folder = os.fspath(folder)
        self.max_bytes = int(max_bytes)
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        check_folder(self.folder)
        self._start()

    def _start(self) -> None:
        self._path = os.path.join(self.folder, DB_NAME)
        self._lock = threading.Lock()
        self._idle: list[Conn] = []  # open, lent to no call (at most _IDLE_MAX)
        self._counts = {"hits": 0, "misses": 0, "corrupt": 0, "failed_gets": 0, "failed_puts": 0}
        # Hits not yet recorded: entry ids by the file they are ids in (a file replaced since
        # is not this one), and when the oldest came.
        self._waiting: dict[tuple[int, int] | None, set[int]] = {}
        self._n_waiting = 0
        self._waiting_since = 0.0
        # Last: after a fork, a thread that sees this process's pid must find the new lock and
        # pool, never the parent's (its lock may be held for good, its connections cross the
        # fork); one that still sees the parent's pid starts anew itself.
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        self.folder = state["folder"]
        self.max_bytes = state["max_bytes"]
        self._start()

    def _borrow(self) -> Conn:
        """An open connection for one call: an idle one, or a new one. Anew after a fork (a
        connection must not cross one) and after a damaged database was replaced."""
        if os.getpid() != self._pid:
            self._start()  # the parent's connections and lock are abandoned, never touched
        current = identity(self._path)
        stale = []
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.file == current:
                    break
                stale.append(conn)
            else:
                conn = None
        for old in stale:
            old.close()
        if conn is not None:
            return conn
        try:
            return open_db(self.folder)
        except sqlite3.DatabaseError as e:
            if not sql.damaged(e):
                raise
            self._replace(None, e)
            return open_db(self.folder)

    def _give_back(self, conn: Conn) -> None:
        with self._lock:
            if os.getpid() == self._pid and len(self._idle) < _IDLE_MAX:
                self._idle.append(conn)
                return
        conn.close()

    def _replace(self, conn: Conn | None, error: sqlite3.DatabaseError) -> None:
        """Deletes the damaged database so the next connection starts an empty one, unless
        another process has done so since this connection opened it."""
        seen = conn.file if conn is not None else identity(self._path)
        if conn is not None:
            conn.close()
        with file_lock(self.folder):
            if identity(self._path) != seen:
                return  # already replaced by someone else
            log.warning("Token cache %s damaged (%s): deleted, starting empty.", self._path, error)
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self._path + suffix)

    def _run(self, op):
        """Runs `op(conn)` on a borrowed connection; a damaged database is replaced and `op`
        runs once more on the new, empty one (a second failure is not the file's fault, and
        is raised). A connection that failed is closed, not lent again."""
        conn = self._borrow()
        try:
            result = op(conn)
        except sqlite3.DatabaseError as e:
            if not sql.damaged(e):
                conn.close()
                raise
            with contextlib.suppress(sqlite3.Error):
                conn.db.rollback()
            self._replace(conn, e)
            conn = self._borrow()
            try:
                result = op(conn)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()
            raise
        self._give_back(conn)
        return result

    def get_many(self, namespace: str, keys: list[bytes]) -> list[np.ndarray | None]:
        """The ids stored for each key, in order; None for a key not stored.

        A damaged entry (wrong length or checksum) is a miss, and is deleted so that the
        caller's put stores it again. Entries found become the most recently used, recorded
        within about a second (see `_record`).

        Returns:
            read-only int32 arrays, or None.
        """
        if not keys:
            return []
        try:
            found = self._run(lambda conn: self._get(conn, namespace, keys))
        except (sqlite3.Error, OSError) as e:
            # Not damage (that is replaced above): a full disk, a lost mount, a lock held for
            # longer than the busy timeout. A cache that cannot read only misses.
            self._failed("failed_gets", f"could not read {len(keys)} entries", e)
            found = {}
        out = [found.get(bytes(k)) for k in keys]
        hits = sum(a is not None for a in out)
        with self._lock:
            self._counts["hits"] += hits
            self._counts["misses"] += len(out) - hits
        return out

    def _get(self, conn: Conn, namespace: str, keys: list[bytes]) -> dict:
        unique = list(dict.fromkeys(bytes(k) for k in keys))
        found: dict[bytes, np.ndarray] = {}
        hit_ids, bad = [], []
        # Read outside any transaction: readers never wait in WAL mode, and the write lock is
        # taken below only now and then, to record the hits and delete damaged entries.
        for chunk in sql.chunks(unique):
            rows = conn.db.execute(sql.select(len(chunk)), (namespace, *chunk))
            for id_, key, blob, n, crc, stamp in rows:
                if len(blob) != n * _DTYPE.itemsize or zlib.crc32(blob) != crc:
                    bad.append((key, stamp))
                else:
                    found[key] = np.frombuffer(blob, dtype=_DTYPE)
                    hit_ids.append(id_)
        with self._lock:
            if hit_ids:
                if not self._n_waiting:
                    self._waiting_since = time.monotonic()
                waiting = self._waiting.setdefault(conn.file, set())
                before = len(waiting)
                waiting.update(hit_ids)
                self._n_waiting += len(waiting) - before
            full = self._n_waiting >= _RECORD_AT
            due = full or (
                self._n_waiting and time.monotonic() - self._waiting_since >= _RECORD_AFTER_S
            )
            self._counts["corrupt"] += len(bad)
        if bad:
            log.warning("%d damaged token cache entries in %r; deleting them.", len(bad), namespace)
        if due or bad:
            # Waits for the write lock only when it must: damage to delete, or memory to bound.
            self._write(conn, namespace, bad, wait=bool(bad), full=full)
        return found

    def _write(
        self, conn: Conn, namespace: str, bad: list, wait: bool = True, full: bool = False
    ) -> None:
        """Records the waiting hits and deletes the damaged entries, in one transaction.
        Without `wait`, a write lock held elsewhere leaves the hits waiting for a later get,
        or, once `full`, forgets them (their entries keep their older use)."""
        db = conn.db
        try:
            if not wait:  # another writer holds the lock: try again at the next get
                db.execute("PRAGMA busy_timeout = 0")
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:  # busy (past the timeout): the order can wait
            log.debug("token cache: hits not recorded yet (%s)", e)
            if full:  # memory stays bounded; eviction order is off by these hits only
                with self._lock:
                    self._waiting, self._n_waiting = {}, 0
            return
        finally:
            if not wait:
                db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        try:
            (now,) = db.execute(sql.CLOCK).fetchone()
            self._record(conn, now)
            db.executemany(sql.DELETE_DAMAGED, [(namespace, k, stamp) for k, stamp in bad])
            db.execute("COMMIT")
        except BaseException:
            db.rollback()
            raise

    def _record(self, conn: Conn, now: int) -> None:
        """Marks the waiting hits used at `now`, within the caller's transaction.

        Hits wait in this object's memory and are recorded together: at its next put, at its
        first get a second after the oldest hit that finds the write lock free (any get once
        65536 entries wait), or at close(). Eviction is least recently used to that
        granularity (about a second); hits a process never records (it ends without close())
        leave their entries as last used before.
        """
        with self._lock:
            waiting, self._waiting, self._n_waiting = self._waiting, {}, 0
        # In id order: each page of the recency table is then visited once (at a million
        # entries, 2-7 us a hit instead of 15-19 us in the order read).
        ids = sorted(waiting.get(conn.file, ()))
        for chunk in sql.chunks(ids):
            conn.db.execute(sql.touch(len(chunk)), (now, *chunk))

    def put_many(self, namespace: str, keys: list[bytes], ids: list[np.ndarray]) -> None:
        """Stores each key's ids (replacing what was there), then evicts the least recently
        used entries until the total is within `max_bytes`.

        A database too busy or too full to write is logged and the entries are not stored: a
        cache that cannot write only misses.

        Raises:
            ValueError: lengths differ, or ids are not int32/uint32.
        """
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} id arrays; give one per key.")
        rows = []
        for key, a in zip(keys, ids, strict=True):
            a = np.asarray(a)
            if a.dtype not in (np.int32, np.uint32):
                raise ValueError(f"token ids must be int32 or uint32, got {a.dtype}.")
            # uint32 ids are below 2**31 (vocabularies are), so their bits read back as int32.
            blob = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            rows.append((bytes(key), blob, a.size, zlib.crc32(blob)))
        if not rows:
            return
        try:
            self._run(lambda conn: self._put(conn, namespace, rows))
        except (sqlite3.Error, OSError) as e:
            self._failed("failed_puts", f"could not store {len(rows)} entries", e)

    def _failed(self, count: str, what: str, error: BaseException) -> None:
        """Counts a read or write the cache could not do; logs the first of each kind (and
        every 1000th), since a cache that fails once usually fails every call."""
        with self._lock:
            self._counts[count] += 1
            n = self._counts[count]
        if n == 1 or n % 1000 == 0:
            log.warning("The token cache in %s %s (%d so far): %s", self.folder, what, n, error)

    def _put(self, conn: Conn, namespace: str, rows: list) -> None:
        db = conn.db
        db.execute("BEGIN IMMEDIATE")
        try:
            (now,) = db.execute(sql.CLOCK).fetchone()
            self._record(conn, now)  # first, so that eviction sees this object's hits
            db.executemany(sql.UPSERT, [(namespace, k, b, n, c, now) for k, b, n, c in rows])
            self._evict(db)
            db.execute("COMMIT")
        except BaseException:
            db.rollback()
            raise

    def _evict(self, db: sqlite3.Connection) -> None:
        """Deletes the oldest entries, in one statement, until the total is within bounds."""
        (total,) = db.execute("SELECT bytes FROM meta").fetchone()
        excess = total - self.max_bytes
        if excess <= 0:
            return
        last, after = None, (-1, -1)
        while excess > 0:
            page = db.execute(sql.OLDEST, (*after, _EVICT_PAGE)).fetchall()
            if not page:
                break
            for used, id_, size in page:
                excess -= size
                last = (used, id_)
                if excess <= 0:
                    break
            after = last
        if last is not None:
            db.execute(sql.EVICT, last)

    def digests(self, files: list[tuple[int, ...]]) -> list[bytes | None]:
        """The content digests remembered for files by identity (`token_cache_digest.py`),
        None for each one not remembered; all None if the database cannot be read."""
        try:
            found = self._run(lambda c: [c.db.execute(sql.DIGEST_OF, f).fetchone() for f in files])
        except (sqlite3.Error, OSError) as e:
            self._failed("failed_gets", f"could not read {len(files)} digests", e)
            return [None] * len(files)
        return [row and row[0] for row in found]

    def remember_digests(self, rows: list[tuple[tuple[int, ...], bytes]]) -> None:
        """Keeps each file's digest by its identity (replacing the inode's older one)."""

        def write(conn: Conn) -> None:
            db, now = conn.db, time.time_ns()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(sql.REMEMBER_DIGEST, [(*f, d, now) for f, d in rows])
                db.execute(sql.FORGET_DIGESTS, (sql.MAX_DIGESTS,))
                db.execute("COMMIT")
            except BaseException:
                db.rollback()
                raise

        try:
            self._run(write)
        except (sqlite3.Error, OSError) as e:  # only costs digesting the files again
            self._failed("failed_puts", f"could not store {len(rows)} digests", e)

    def stats(self) -> dict[str, int]:
        """The entries and bytes in the cache (all processes'), and this object's counts of
        hits, misses, damaged entries and puts that could not be stored."""
        meta = self._run(lambda c: c.db.execute("SELECT entries, bytes FROM meta").fetchone())
        entries, size = meta
        with self._lock:
            return {"entries": entries, "bytes": size, **self._counts}

    def close(self) -> None:
        """Records the hits still waiting, then closes every thread's connection; a later
        call opens new ones."""
        if os.getpid() != self._pid:
            self._start()
            return
        if self._n_waiting:
            try:
                self._run(lambda conn: self._write(conn, "", []))
            except sqlite3.Error as e:  # a cache that cannot write only forgets an order
                log.debug("token cache: hits not recorded at close (%s)", e)
        with self._lock:
            conns, self._idle = self._idle, []
        for conn in conns:
            conn.close()
