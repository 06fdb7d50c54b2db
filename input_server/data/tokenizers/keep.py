"""What is derived from a model file, kept on disk (`serve --tokenizer-cache`): the
tokenizer.json derived from tiktoken ranks, the gate's verdict on the probes. Computed once per
model digest and library versions, then read back by every later process and restart instead of
computed again (deriving Llama 3's tokenizer.json took 1.6-1.8 s of each server's first stream).

An entry is one file: a JSON header line (its key, its payload's length and SHA-256) and the
payload. Written to a temporary file and renamed into place, so readers see a whole entry or
none, and two processes writing one entry at once leave one of two whole, equal entries. A file
that does not parse, holds another key, or whose payload's digest differs is damaged: it is
logged, and the caller computes the value again and puts it back. The folder is the operator's
(no request names it) and must not be writable by others: what it holds is served from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from typing import Any

from input_server.data.own_files import check_own_folder, not_own
from input_server.version import __version__

log = logging.getLogger(__name__)

FORMAT = 1
# Entries kept, newest used last out: one or two a model and library version.
MAX_ENTRIES = 64
# The largest payload read back (Llama 3's derived tokenizer.json is 11.5 M characters; one
# derivation is bounded by `fast.MAX_MERGE_CHARS`).
MAX_PAYLOAD_BYTES = 256 << 20
MAX_HEADER_BYTES = 1 << 16
SUFFIX = ".keep"
# A writer's temporary file older than this is a killed writer's: removed when entries are.
STALE_TMP_S = 600


def default_folder() -> str:
    """`$XDG_CACHE_HOME/input-server/tokenizers`, else `~/.cache/input-server/tokenizers`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "input-server", "tokenizers")


def check_folder(folder: str) -> None:
    """Creates `folder` (0700) if missing; refuses one another user owns or may write into:
    a verdict or tokenizer.json planted there would decide the ids served to training."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    check_own_folder(folder, "--tokenizer-cache")


def keep_in(folder: str) -> ModelKeep | None:
    """The keep in `folder` (`check_folder`), or None, with a warning, when the folder cannot
    be made or read: what is derived is then kept in each process's memory only.

    Raises:
      ValueError: another user owns the folder, or others may write into it.
    """
    try:
        check_folder(folder)
    except OSError as e:
        log.warning(
            "--tokenizer-cache %s cannot be used (%s); what is derived from tokenizer models "
            "is kept in memory only",
            *(folder, e),
        )
        return None
    return ModelKeep(folder)


class ModelKeep:
    """Entries by key in `folder` (checked by `check_folder`). Pickles as its folder: worker
    processes may read and write it too."""

    def __init__(self, folder: str):
        # Resolved once: the folder `check_folder` passed, not whatever a link names later.
        self.folder = os.path.realpath(folder)

    def __repr__(self) -> str:
        return f"ModelKeep({self.folder!r})"

    def _path(self, key: dict[str, Any]) -> str:
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        return os.path.join(self.folder, name + SUFFIX)

    @staticmethod
    def full_key(what: str, fields: dict[str, Any]) -> dict[str, Any]:
        """`fields` and what always decides an entry: its kind of value, the format, the
        server's version."""
        return {"what": what, "format": FORMAT, "input_server": __version__, **fields}

    def get(self, what: str, fields: dict[str, Any]) -> bytes | None:
        """The payload kept for (`what`, `fields`), or None: none kept, or a damaged entry
        (logged; `put` replaces it)."""
        key = self.full_key(what, fields)
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("tokenizer cache: cannot read %s (%s); computing %s again", path, e, what)
            return None
        with os.fdopen(fd, "rb") as f:
            why = not_own(os.fstat(f.fileno()))
            if why is not None:
                # Planted by another user, or writable by others since it was written: what it
                # holds would decide the ids served. Left alone; `put` replaces it.
                log.warning(
                    "tokenizer cache: %s is not this server's user's alone (it %s); computing %s "
                    "again and replacing it",
                    *(path, why, what),
                )
                return None
            try:
                payload = _read_entry(f, key)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning(
                    "tokenizer cache: %s is damaged (%s); computing %s again and replacing it",
                    *(path, e, what),
                )
                return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: evicted last
        return payload

    def put(self, what: str, fields: dict[str, Any], payload: bytes) -> None:
        """Keeps `payload` for (`what`, `fields`), atomically; a failure to write is logged,
        never raised (the value is then computed again by the next process)."""
        key = self.full_key(what, fields)
        path = self._path(key)
        header = json.dumps(
            {"key": key, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()},
            sort_keys=True,
        ).encode()
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(header + b"\n")
                    f.write(payload)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._evict()
        except OSError as e:
            log.warning(
                "tokenizer cache: cannot write %s (%s); %s is kept in memory only", path, e, what
            )

    def _evict(self) -> None:
        """The least recently used entries past MAX_ENTRIES removed, and killed writers'
        temporary files."""
        entries, stale = [], time.time() - STALE_TMP_S
        with os.scandir(self.folder) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    if e.name.endswith(SUFFIX):
                        entries.append((st.st_mtime_ns, e.path))
                    elif (
                        e.name.startswith(".") and e.name.endswith(".tmp") and (st.st_mtime < stale)
                    ):
                        os.unlink(e.path)
        for _, path in sorted(entries)[: max(0, len(entries) - MAX_ENTRIES)]:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _read_entry(f, key: dict[str, Any]) -> bytes:
    """The payload of the entry open in `f`, checked against `key`, its length and digest."""
    line = f.readline(MAX_HEADER_BYTES + 1)
    if not line.endswith(b"\n"):
        raise ValueError("no header line")
    header = json.loads(line)
    if header["key"] != key:
        raise ValueError("it holds another key")
    size = header["bytes"]
    if not isinstance(size, int) or not 0 <= size <= MAX_PAYLOAD_BYTES:
        raise ValueError(f"a payload of {size!r} bytes")
    payload = f.read(size + 1)
    if len(payload) != size:
        raise ValueError(f"{len(payload)} bytes of payload where the header says {size}")
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise ValueError("its payload's SHA-256 differs from the one stored with it")
    return payload
