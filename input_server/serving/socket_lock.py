"""Which process serves a socket file: the one that holds its lock, a name in the abstract Unix
socket namespace derived from the file's path. The kernel frees the name when its process
ends, however it ends (SIGKILL too), and nothing is left in the socket's folder; a standby
server (`serve --standby`) waits for the name and takes the socket over the moment the
server holding it is gone."""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import time

# How often a standby tries for the lock: a takeover starts within this after the server
# holding it died.
POLL_S = 0.02


class SocketLock:
    """The lock of the socket file at `path` (`take`, `wait`); held until `release` or the
    process ends."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        digest = hashlib.sha256(os.path.realpath(self.path).encode()).hexdigest()[:40]
        self.name = f"\0input-server-socket:{digest}"
        self._sock: socket.socket | None = None

    @property
    def held(self) -> bool:
        return self._sock is not None

    def take(self) -> bool:
        """Takes the lock if it is free; whether this process holds it now.

        Raises:
          OSError: the abstract namespace is not there (not Linux), or another failure.
        """
        if self._sock is not None:
            return True
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(self.name)
        except OSError as e:
            s.close()
            if e.errno == errno.EADDRINUSE:
                return False
            raise
        os.set_inheritable(s.fileno(), False)  # a worker process must not hold it on
        self._sock = s
        return True

    def wait(self, poll_s: float = POLL_S) -> None:
        """Takes the lock once it is free (the server holding it has ended), however long."""
        while not self.take():
            time.sleep(poll_s)

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
