"""What the token cache keys a pipeline's documents on: each source file's content digest, read
once per file identity and remembered in the cache, and the check that the files still are so.

Why a digest of the bytes and not the metadata: a file rewritten in place with its size and
mtime kept (`cp -p`, `rsync -t`, tar, a restored backup, an image with fixed mtimes) passes any
check of size and mtime, and was served the old text's ids. Why once per identity and not at
every stream: digesting reads the whole corpus (0.43 GB/s read and hashed on the development
VM: two minutes for 50 GB; docs/benchmarks.md), while a stat costs microseconds. The identity is
(dev, inode, size, mtime_ns, ctime_ns): ctime is set by the kernel to its clock on every
write, truncate, rename onto, utime or chmod, and no system call sets it back, so a rewrite
with the old size and mtime still gets a new identity and is digested again.

Two edges of that argument are handled here. Timestamps are coarse (the kernel's clock tick,
1 s on some file systems): a file changed twice within one tick keeps one ctime, so a digest
is taken only once the file's ctime is `RACY_NS` old (as git's "racily clean" entries), and
then any later write gets a later ctime. And a file can change while it is read: its identity
is taken before and after, and it is read again if they differ. What this trusts: the file
system's ctime is the kernel's change time (true of Linux's local file systems, NFS, overlay;
not of vfat/exfat, which have no ctime) and its clock is not behind this host's. Not covered:
a file changed while its pipeline is being opened, after its reader indexed it and before the
digest (the pipeline opens its files before it asks for the digests).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Sequence

from input_server import cancel

log = logging.getLogger("input_server.data.token_cache")

# sha256, not blake2b: OpenSSL's runs on the CPU's SHA extensions where present (0.95 GB/s
# against blake2b's 0.42 on the development host), and it is collision resistant, so no two
# texts share a namespace.
DIGEST = "sha256"
RACY_NS = 2_000_000_000  # above any file system's timestamp tick (FAT's 2 s the coarsest)
SETTLE_S = 2 * RACY_NS / 1e9 + 1.0  # how long a file may take to settle before it is read
ATTEMPTS = 3  # reads of a file that changes while read, before the cache gives up on it
_BUFFER = 1 << 20

Identity = tuple[int, int, int, int, int]


class Unsettled(Exception):
    """A file kept changing (or changed within `RACY_NS`) while it was digested: its ids
    cannot be tied to one text, so the pipeline does without the cache. Never reaches a
    client: the stream's log says why the cache is not used."""


def identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclasses.dataclass(frozen=True)
class FileState:
    """A file as it was digested."""

    path: str
    identity: Identity
    digest: bytes


def file_states(cache, paths: Sequence[str]) -> list[FileState]:
    """Each file's digest: remembered in `cache` (a `TokenCache`) for the identity it has now,
    or read now (and remembered).

    Raises:
      Unsettled: a file changed while read, or within `RACY_NS` for `SETTLE_S`.
      OSError: a file cannot be read.
    """
    paths = list(dict.fromkeys(paths))  # a file two components read is digested once
    now = [identity(os.stat(p)) for p in paths]
    known = cache.digests(now)
    states, new = [], []
    for path, ident, digest in zip(paths, now, known, strict=True):
        if digest is None:
            ident, digest = _digest(path, time.monotonic() + SETTLE_S)
            new.append((ident, digest))
        states.append(FileState(path, ident, digest))
    if new:
        cache.remember_digests(new)
    return states


def _settled(path: str, deadline: float) -> os.stat_result:
    """The file's stat once its last change is `RACY_NS` old: every later write then gets a
    later ctime, however coarse the file system's clock."""
    while True:
        st = os.stat(path)
        age_ns = time.time_ns() - st.st_ctime_ns
        if age_ns >= RACY_NS:
            return st
        if time.monotonic() >= deadline:
            raise Unsettled(
                f"{path!r} changed less than {RACY_NS / 1e9:g} s ago, for {SETTLE_S:g} s (still "
                "being written, or its file system's clock runs ahead of this host's)"
            )
        cancel.check()
        time.sleep(min(0.1, max(0.01, (RACY_NS - age_ns) / 1e9)))


def _digest(path: str, deadline: float) -> tuple[Identity, bytes]:
    """The file's identity and the digest of its bytes while it had that identity."""
    buf = bytearray(_BUFFER)
    view = memoryview(buf)
    for _ in range(ATTEMPTS):
        before = identity(_settled(path, deadline))
        h = hashlib.new(DIGEST)
        with open(path, "rb") as f:
            if identity(os.fstat(f.fileno())) != before:
                continue  # replaced between the stat and the open
            while n := f.readinto(buf):
                h.update(view[:n])
                cancel.check()
            after = identity(os.fstat(f.fileno()))
        if after == before == identity(os.stat(path)):
            return before, h.digest()
    raise Unsettled(f"{path!r} changed each of the {ATTEMPTS} times it was read")


class SourceFiles:
    """A pipeline's files as digested, and whether they still are: ids kept for those bytes
    may be served, and ids of bytes read may be kept under them, only while every file has
    the identity it was digested with. The first change found turns the cache off for the
    pipeline for good (its readers indexed the old bytes; a new pipeline digests anew)."""

    def __init__(self, states: list[FileState]):
        self.states = states
        self.changed: str | None = None
        self._checked = time.monotonic()

    def unchanged(self, every_s: float = 0.0) -> bool:
        """Whether no file changed: checked now (one stat a file), or trusted if checked
        within `every_s` seconds."""
        if self.changed is not None:
            return False
        now = time.monotonic()
        if every_s and now - self._checked < every_s:
            return True
        self._checked = now
        for s in self.states:
            try:
                same = identity(os.stat(s.path)) == s.identity
            except OSError:
                same = False
            if not same:
                self.changed = s.path
                log.warning(
                    "%r changed since its pipeline digested it: the token cache serves and "
                    "keeps none of that pipeline's ids any more (a new pipeline digests it "
                    "again).",
                    s.path,
                )
                return False
        return True
