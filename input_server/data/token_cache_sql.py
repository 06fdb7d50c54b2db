"""The token cache's SQLite layout: its tables, the triggers that keep totals and recency, and
the statements that read and change them."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence

VERSION = 3  # `PRAGMA user_version`; a file of another layout is emptied and laid out anew
CHUNK = 900  # keys per `IN (...)`: under sqlite's oldest limit of 999 variables a statement

# `bytes` counts what the entries hold (ids and key); the file is larger by sqlite's pages.
# Triggers keep the totals and the recency rows, so every change (put, eviction, deletion of
# a damaged entry, by any process) updates them in its own transaction, and no total needs a
# scan of the table.
#
# Recency lives apart from the ids, one narrow row an entry: marking a hit used rewrites a few
# bytes, not the pages holding its ids (2 kB for 500 ids), and a flush of thousands of hits
# dirties at most the recency table's and its index's pages. `stamp` is the clock at the
# entry's last put: the version a reader saw, so a damaged entry put again since is kept.
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS tokens (
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    key BLOB NOT NULL,
    ids BLOB NOT NULL,
    n INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    stamp INTEGER NOT NULL,
    UNIQUE (namespace, key)
);
CREATE TABLE IF NOT EXISTS recency (
    id INTEGER PRIMARY KEY,
    used INTEGER NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS recency_used ON recency (used);
-- Each source file's content digest by its identity (`token_cache_digest.py`): a file seen
-- again unchanged is not read again. One row an inode (a rewritten file's row is replaced).
CREATE TABLE IF NOT EXISTS digests (
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    digest BLOB NOT NULL,
    stamp INTEGER NOT NULL,
    PRIMARY KEY (dev, ino)
);
CREATE TABLE IF NOT EXISTS meta (
    one INTEGER PRIMARY KEY CHECK (one = 0),
    clock INTEGER NOT NULL,
    entries INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta VALUES (0, 0, 0, 0);
CREATE TRIGGER IF NOT EXISTS tokens_insert AFTER INSERT ON tokens BEGIN
    UPDATE meta SET entries = entries + 1,
        bytes = bytes + length(NEW.ids) + length(NEW.key);
    INSERT OR REPLACE INTO recency VALUES
        (NEW.id, NEW.stamp, length(NEW.ids) + length(NEW.key));
END;
CREATE TRIGGER IF NOT EXISTS tokens_delete AFTER DELETE ON tokens BEGIN
    UPDATE meta SET entries = entries - 1,
        bytes = bytes - length(OLD.ids) - length(OLD.key);
    DELETE FROM recency WHERE id = OLD.id;
END;
CREATE TRIGGER IF NOT EXISTS tokens_update AFTER UPDATE OF ids, stamp ON tokens BEGIN
    UPDATE meta SET bytes = bytes + length(NEW.ids) - length(OLD.ids);
    UPDATE recency SET used = max(used, NEW.stamp), size = length(NEW.ids) + length(NEW.key)
        WHERE id = NEW.id;
END;
PRAGMA user_version = {VERSION};
"""
# Run before SCHEMA on a file of an older layout (the cache is only a cache: it starts empty).
DROP = (
    "DROP TABLE IF EXISTS tokens; DROP TABLE IF EXISTS recency; DROP TABLE IF EXISTS meta; "
    "DROP TABLE IF EXISTS digests;"
)

UPSERT = (
    "INSERT INTO tokens (namespace, key, ids, n, crc, stamp) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (namespace, key) DO UPDATE SET "
    "ids = excluded.ids, n = excluded.n, crc = excluded.crc, stamp = excluded.stamp"
)
CLOCK = "UPDATE meta SET clock = clock + 1 RETURNING clock"
# The stamp as read: an entry put again since (by another process) is left alone.
DELETE_DAMAGED = "DELETE FROM tokens WHERE namespace = ? AND key = ? AND stamp = ?"
# Eviction walks recency oldest first, a page at a time after (used, id), reading no ids; then
# deletes up to where the excess is covered (the delete trigger removes the recency rows).
OLDEST = (
    "SELECT used, id, size FROM recency "
    "WHERE used >= ?1 AND (used > ?1 OR id > ?2) ORDER BY used, id LIMIT ?3"
)
EVICT = (
    "DELETE FROM tokens WHERE id IN "
    "(SELECT id FROM recency WHERE used <= ?1 AND (used < ?1 OR id <= ?2))"
)
# A file's digest, if remembered for the identity it has now (dev, ino, size, mtime, ctime).
DIGEST_OF = (
    "SELECT digest FROM digests WHERE dev = ? AND ino = ? AND size = ? AND mtime_ns = ? "
    "AND ctime_ns = ?"
)
REMEMBER_DIGEST = "INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?, ?, ?, ?)"
# Rows past this many (files no longer served, or on devices gone) go, oldest stamp first:
# ~100 bytes a row, so the table stays within about 10 MB whatever clients name.
MAX_DIGESTS = 100_000
FORGET_DIGESTS = (
    "DELETE FROM digests WHERE rowid IN (SELECT rowid FROM digests ORDER BY stamp "
    "LIMIT max(0, (SELECT count(*) FROM digests) - ?))"
)
# Damaged database files, as opposed to busy or full ones (which are not the file's fault).
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def damaged(e: sqlite3.DatabaseError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:  # raised by the module, not by sqlite: only "file is not a database" kind
        return type(e) is sqlite3.DatabaseError
    return code & 0xFF in _DAMAGED  # the extended code's low byte is the primary code


def chunks(items: Sequence, size: int = CHUNK) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _marks(n: int) -> str:
    return ",".join("?" * n)


def select(n: int) -> str:
    """Reads `n` keys' entries of one namespace."""
    return (
        "SELECT id, key, ids, n, crc, stamp FROM tokens "
        f"WHERE namespace = ? AND key IN ({_marks(n)})"
    )


def touch(n: int) -> str:
    """Marks `n` entries, by id, used at a time."""
    return f"UPDATE recency SET used = ? WHERE id IN ({_marks(n)})"
