"""What every reader of one file provides, the checks on a record's text they share, the
descriptors they may hold open in one process (`OPEN_FILES`) and the decompressed text they may
hold in it (`DECOMPRESSED`)."""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import resource
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import orjson

from input_server.errors import InvalidSpecError, RecordError

log = logging.getLogger(__name__)


class Reader(Protocol):
    """Random access to the documents of one file."""

    path: str
    name: str  # the path as the client wrote it, for messages
    max_bytes: int | None  # a longer record is refused (`check_size`)

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str | np.ndarray: ...  # ids with `token_field`

    def read_many(self, indices: Sequence[int]) -> list[str] | list[np.ndarray]:
        """The records at `indices`, in the order given: each as `reader[i]` gives it, read
        in bulk (a group's records from one file)."""
        ...

    def where(self, index: int) -> str:
        """Names the record for error messages, e.g. `data.jsonl line 12`."""
        ...

    def release(self) -> None:
        """Closes the reader's descriptors and maps now (not at garbage collection); it
        opens them again if read."""
        ...

    def close(self) -> None:
        """`release`, and drops what it holds in memory (decompressed text, a column)."""
        ...


def check_size(size: int, limit: int | None, where: str) -> None:
    """Refuses a record over the server's --max-document-mb before it is decoded: a 200 MB
    document would hold gigabytes while tokenized (INVALID_ARGUMENT, naming it and the limit)."""
    if limit is not None and size > limit:
        raise InvalidSpecError(
            f"{where}: the document is {size / (1 << 20):,.1f} MB, over the "
            f"server's --max-document-mb {limit / (1 << 20):g}; split it, or "
            f"ask the operator for a larger limit."
        )


def text_of(obj: object, field: str, where: str) -> str:
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(obj).__name__}.")
    if field not in obj:
        keys = ", ".join(sorted(obj)[:10])
        raise RecordError(f"{where}: no field {field!r} (the record has: {keys}).")
    text = obj[field]
    if not isinstance(text, str):
        raise RecordError(f"{where}: field {field!r} holds {type(text).__name__}, not a string.")
    try:
        text.encode()
    except UnicodeEncodeError as e:  # a lone surrogate escape ("\ud800"), which orjson refuses
        raise RecordError(f"{where}: field {field!r} is not valid Unicode ({e}).") from e
    return text


def loads_json(raw: bytes) -> object:
    """orjson (several times faster) first; the standard parser for what orjson refuses."""
    try:
        return orjson.loads(raw)
    except ValueError:
        return json.loads(raw)


# --- Descriptors -----------------------------------------------------------------------------

# Of the process's descriptor limit, the share readers may keep open (the rest: sockets,
# Grain's pipes and shared memory, the model), and a cap: past ~1,000 files a source thrashes
# a little on reopening (an open and an mmap, microseconds), and vm.max_map_count (65,530 by
# default) stays far away.
_SHARE_OF_LIMIT = 4
_MAX_DEFAULT_OPEN = 1024
_MIN_OPEN = 8
# --max-open-files, for Grain's worker processes: spawned, they inherit the environment (and
# the raised descriptor limit), not what the server set in its own `OPEN_FILES`.
OPEN_FILES_ENV = "INPUT_SERVER_MAX_OPEN_FILES"


def default_max_open(soft_limit: int) -> int:
    """The readers' descriptors a process with `soft_limit` (RLIMIT_NOFILE) keeps open."""
    return max(_MIN_OPEN, min(_MAX_DEFAULT_OPEN, soft_limit // _SHARE_OF_LIMIT))


class _Entry:
    __slots__ = ("handle", "closer", "pins", "dropped")

    def __init__(self, handle: Any, closer: Callable[[Any], None]):
        self.handle, self.closer, self.pins, self.dropped = handle, closer, 0, False


class OpenFiles:
    """The files (maps, readers) readers hold open in this process: at most `capacity` at once,
    the least recently used closed first, so a source of 100,000 files holds a few hundred
    descriptors, all streams together. A handle in use (`use`) is never closed under its user:
    it closes when let go."""

    def __init__(self, capacity: int | None = None):
        self._capacity = capacity
        # Reentrant: a reader's finalizer (`close`) may run during a collection triggered
        # while this thread holds the lock.
        self._lock = threading.RLock()
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._watched: set[int] = set()

    @property
    def capacity(self) -> int:
        if self._capacity is None:
            self._capacity = _configured_open() or default_max_open(
                resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            )
        return self._capacity

    @capacity.setter
    def capacity(self, n: int) -> None:
        self._capacity = n
        self._close(self._evict())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @contextlib.contextmanager
    def use(
        self, owner: object, opener: Callable[[], Any], closer: Callable[[Any], None]
    ) -> Iterator[Any]:
        """`owner`'s open handle (`opener()` if it has none), kept open within the block."""
        key = id(owner)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                entry.pins += 1
        if entry is None:
            entry = self._add(owner, key, self._open(opener), closer)
        try:
            yield entry.handle
        finally:
            with self._lock:
                entry.pins -= 1
                done = [entry] if entry.dropped and entry.pins == 0 else []
                done += self._evict()
            self._close(done)

    def _open(self, opener: Callable[[], Any]) -> Any:
        try:
            return opener()
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            # Out of descriptors: give back every handle not in use, and try once more.
            with self._lock:
                idle = [k for k, v in self._entries.items() if v.pins == 0]
                done = [self._entries.pop(k) for k in idle]
            self._close(done)
            return opener()

    def _add(self, owner: object, key: int, handle: Any, closer: Callable[[Any], None]) -> _Entry:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(handle, closer)
                if key not in self._watched:  # freed with its owner, if never closed
                    self._watched.add(key)
                    weakref.finalize(owner, self._forget, key)
                spare = None
            else:  # another thread opened it meanwhile
                self._entries.move_to_end(key)
                spare = _Entry(handle, closer)
            entry.pins += 1
        if spare is not None:
            self._close([spare])
        return entry

    def _evict(self) -> list[_Entry]:
        """Takes the least recently used handles not in use out, down to the capacity."""
        with self._lock:
            over = len(self._entries) - self.capacity
            if over <= 0:
                return []
            idle = [k for k, v in self._entries.items() if v.pins == 0][:over]
            return [e for e in (self._entries.pop(k, None) for k in idle) if e is not None]

    def close_oldest_idle(self) -> bool:
        """Closes the least recently used handle not in use now; False if every one is."""
        with self._lock:
            key = next((k for k, v in self._entries.items() if v.pins == 0), None)
            entry = None if key is None else self._entries.pop(key)
        if entry is None:
            return False
        self._close([entry])
        return True

    def close(self, owner: object) -> None:
        """Closes `owner`'s handle now (or, if in use, as soon as it is let go)."""
        self._drop(id(owner))

    def _forget(self, key: int) -> None:
        with self._lock:
            self._watched.discard(key)
        self._drop(key)

    def _drop(self, key: int) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return
            entry.dropped = True
            if entry.pins:
                return
        self._close([entry])

    @staticmethod
    def _close(entries: list[_Entry]) -> None:
        for e in entries:
            try:
                e.closer(e.handle)
            except Exception:  # noqa: BLE001 - a close that fails frees what it can; go on
                log.warning("closing a data file failed", exc_info=True)


OPEN_FILES = OpenFiles()


def _configured_open() -> int | None:
    """The server's --max-open-files, in a worker process it started (`OPEN_FILES_ENV`)."""
    value = os.environ.get(OPEN_FILES_ENV)
    if not value:
        return None
    try:
        return max(1, int(value))
    except ValueError:
        log.warning("ignoring %s=%r (not a number of files)", OPEN_FILES_ENV, value)
        return None


def configure_open_files(max_open: int | None) -> int:
    """At server start: raises this process's soft descriptor limit to its hard limit (Grain's
    worker processes inherit it), then sets how many files readers keep open (`max_open`,
    default `default_max_open`), here and, through `OPEN_FILES_ENV`, in the worker processes
    it spawns later. Returns that number.

    Raises:
      ValueError: `max_open` would leave under half the descriptor limit to the rest.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    try:
        with open("/proc/sys/fs/nr_open") as f:  # the kernel's cap on any process's limit
            nr_open = int(f.read())
        target = nr_open if hard == resource.RLIM_INFINITY else min(hard, nr_open)
    except (OSError, ValueError):
        pass
    if target != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("descriptor limit (ulimit -n) raised from %d to %d", soft, target)
            soft = target
        except (OSError, ValueError) as e:
            log.warning("cannot raise the descriptor limit %d to %d: %s", soft, target, e)
    if max_open is not None and max_open > soft // 2:
        raise ValueError(
            f"--max-open-files {max_open} would leave too few of the process's {soft} "
            f"descriptors (ulimit -n) to sockets and worker pipes; use at most {soft // 2}, "
            f"or raise the limit."
        )
    if max_open is None:  # workers find the same default under the limit they inherit
        os.environ.pop(OPEN_FILES_ENV, None)
    else:
        os.environ[OPEN_FILES_ENV] = str(max_open)
    OPEN_FILES.capacity = max_open if max_open is not None else default_max_open(soft)
    log.info("readers keep at most %d data files open", OPEN_FILES.capacity)
    return OPEN_FILES.capacity


# --- Decompressed text -----------------------------------------------------------------------


class DecompressedBudget:
    """The bytes of compressed files this process holds decompressed, every stream and source
    together, within --max-decompressed-mb: reserved chunk by chunk as a file is decompressed
    (`Reservation.grow`), given back when its reader drops the text (`close`) or is collected.
    Readers without a bound (the operator's own, in scripts) are not counted."""

    def __init__(self):
        self._lock = threading.RLock()  # a Reservation may be collected while it is held
        self._held = 0

    @property
    def held(self) -> int:
        return self._held

    def reserve(self, r: Reservation, n: int, limit: int) -> bool:
        """Adds `n` bytes to `r` and the total, unless the total would pass `limit`."""
        with self._lock:
            if self._held + n > limit:
                return False
            self._held += n
            r.bytes += n
            return True

    def release(self, r: Reservation) -> None:
        """Gives back all `r` holds."""
        with self._lock:
            self._held -= r.bytes
            r.bytes = 0


DECOMPRESSED = DecompressedBudget()
# What readers hold decoded in `DECOMPRESSED` and can load again (a Parquet column): the
# same LRU as `OPEN_FILES`, bounded by bytes instead of a count. A reservation that would
# pass the budget closes the least recently used ones not in use (`Reservation.grow`), so the
# budget bounds what is held at once, not the sum of every file a process ever read.
DECODED = OpenFiles(capacity=sys.maxsize)


class Reservation:
    """One decompressed buffer's share of `DECOMPRESSED`, given back by `free` (at most once)
    or when the reservation is collected with its reader."""

    __slots__ = ("bytes",)

    def __init__(self):
        self.bytes = 0

    def grow(self, n: int, limit: int | None) -> bool:
        """Reserves `n` more bytes, unless the process would then hold more than `limit`
        once every loaded column not in use right now (`DECODED`) is given back, least
        recently used first. What alone is past `limit` is refused without evicting."""
        if limit is None:
            return True
        if self.bytes + n > limit:
            return False
        while not DECOMPRESSED.reserve(self, n, limit):
            if not DECODED.close_oldest_idle():
                return False  # what is held is being read now: it cannot be given back
            _note_eviction(limit)
        return True

    def free(self) -> None:
        DECOMPRESSED.release(self)

    def __del__(self):
        if self.bytes:
            self.free()


_EVICTION_LOG_EVERY_S = 60.0
_last_eviction_log = [-_EVICTION_LOG_EVERY_S]


def _note_eviction(limit: int) -> None:
    """Says (once a minute at most) that columns are being given back: a working set past
    the budget loads them again and again, which the operator sees only as slow streams."""
    now = time.monotonic()
    if now - _last_eviction_log[0] >= _EVICTION_LOG_EVERY_S:
        _last_eviction_log[0] = now
        log.info(
            "--max-decompressed-mb %g: gave back a loaded Parquet column to make room; the "
            "files being read take more than that decoded, so columns load again when read "
            "(a larger limit avoids it)",
            limit / (1 << 20),
        )


def said(e: BaseException, path: str, name: str) -> str:
    """What a library's error says, the real `path` it may quote given as `name` (the path
    the client wrote): a message never tells where a link inside the roots leads."""
    return str(e).replace(path, name) if path != name else str(e)
