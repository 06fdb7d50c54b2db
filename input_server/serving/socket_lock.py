"""Which process serves a socket file: the one that holds its lock, an `flock` on the file
`PATH.lock` beside it. The kernel drops the lock when its process ends, however it ends
(SIGKILL too); a standby server (`serve --standby`) waits for it and takes the socket over the
moment the server holding it is gone. The lock file is keyed by its inode, so it holds across
network and mount namespaces and is guarded by the folder's own permissions; it is never
removed (a waiter would hold a lock on a file nobody else opens)."""

from __future__ import annotations

import fcntl
import os
import time
import weakref

# How often a standby tries for the lock: a takeover starts within this after the server
# holding it died.
POLL_S = 0.02

# Locks held in this process: a child it forks (not `serve`'s own worker processes, which are
# spawned) closes its copies, or it would hold them after this process ends.
_HELD: weakref.WeakSet[SocketLock] = weakref.WeakSet()


def _forget_in_child() -> None:
    for lock in list(_HELD):
        lock.release()


os.register_at_fork(after_in_child=_forget_in_child)


class SocketLock:
    """The lock of the socket file at `path` (`take`); held until `release` or the
    process ends."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.file = self.path + ".lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def take(self) -> bool:
        """Takes the lock if it is free; whether this process holds it now.

        Raises:
          OSError: the lock file cannot be opened (the message names it).
        """
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise OSError(f"cannot open the socket's lock file {self.file} ({e.strerror}).") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _HELD.add(self)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            _HELD.discard(self)


def take_all(locks: list[SocketLock]) -> bool:
    """Takes every lock of `locks`, or none (those taken given back): two standbys that list
    the same socket files in other orders cannot each hold one."""
    for i, lock in enumerate(locks):
        if not lock.take():
            for taken in locks[:i]:
                taken.release()
            return False
    return True


def wait_for_all(locks: list[SocketLock], poll_s: float = POLL_S) -> None:
    """Takes every lock of `locks` once all are free (their servers have ended), however long."""
    while not take_all(locks):
        time.sleep(poll_s)
