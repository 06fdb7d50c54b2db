"""The token cache's folder and its connections (`token_cache.py` uses them): the database file,
the lock that serializes setting it up and replacing it between processes, and the check that
nobody else can write into the folder."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator

from input_server.data import token_cache_sql as sql
from input_server.data.own_files import check_own_folder

log = logging.getLogger("input_server.data.token_cache")

DB_NAME = "tokens.sqlite3"  # fixed: namespaces and keys are data in the table, never paths
LOCK_NAME = "tokens.lock"  # serializes setting up and replacing the database between processes
BUSY_TIMEOUT_S = 30.0  # writers of other processes wait this long for the write lock
WAL_LIMIT_BYTES = 64 << 20  # the WAL is cut back to this after a checkpoint (default: never)


class Conn:
    """A connection, and the file it opened (to notice a database replaced since)."""

    def __init__(self, path: str):
        # Autocommit (isolation_level=None): transactions are begun explicitly, IMMEDIATE for
        # writes, because a read upgraded to a write fails at once (no busy wait) in WAL mode
        # when another process has written in between.
        self.db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self.file = identity(path)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()


def check_folder(folder: str) -> None:
    """Refuses a folder that another user could write into: ids planted there would be served
    to training as if tokenized here. The database and lock inside must not be links."""
    check_own_folder(folder, "token cache folder")
    for name in (DB_NAME, LOCK_NAME):
        if os.path.islink(os.path.join(folder, name)):
            raise ValueError(
                f"{os.path.join(folder, name)!r} is a symbolic link; the token cache writes "
                "only its own files: remove it."
            )


def identity(path: str) -> tuple[int, int] | None:
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(path)
        return st.st_dev, st.st_ino
    return None


def open_db(folder: str) -> Conn:
    """A new connection to the database in `folder`, its file set up (WAL, the layout of this
    version) under the folder's file lock."""
    path = os.path.join(folder, DB_NAME)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    conn = Conn(path)
    db = conn.db
    try:
        # NORMAL: in WAL mode a power loss can drop the last commits but not corrupt the
        # file, and a lost cache entry only costs a tokenization.
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA temp_store = MEMORY")  # sorts stay out of /tmp
        db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
        # Under the file lock: a change of journal mode fails at once, without waiting,
        # beside another connection; WAL is a property of the file, set once.
        with file_lock(folder):
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            # The layout is written with its version, in one transaction.
            if db.execute("PRAGMA user_version").fetchone()[0] != sql.VERSION:
                old = db.execute("SELECT 1 FROM sqlite_schema WHERE name = 'tokens'")
                drop = sql.DROP if old.fetchone() else ""
                if drop:
                    log.info("Token cache %s has an older layout: emptied.", path)
                db.executescript("BEGIN IMMEDIATE;" + drop + sql.SCHEMA + "COMMIT;")
            conn.file = identity(path)  # the file exists now, whatever it was
    except sqlite3.Error:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def file_lock(folder: str) -> Iterator[None]:
    """The folder's lock between processes: setting up and replacing the database."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
    fd = os.open(os.path.join(folder, LOCK_NAME), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock
