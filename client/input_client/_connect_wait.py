"""One wait for a server to answer: what it says at once, what it says while it waits, and
the one line it ends with.

A Unix socket file that does not exist yet is waited for (a sidecar starting), and said
within a second, naming the other default path where a server does listen when there is one
(a `serve` started with another XDG_RUNTIME_DIR: tmux, an IDE, cron). A socket file nobody
answers on (left by a killed server) is said at once and waited on the same way: a restarted
sidecar binds it again. Over TCP, a refused connection is waited for too: a server starting on
the same host (a sidecar over TCP, a restarted pod) refuses for its first seconds, and a client
started alongside must not fail then. But it is said at once, in one warning line, and the
final error names it: before, a refused connect waited 30 s in silence and ended without a
hint. A host name that does not exist (the resolver says so, not a lookup that timed out)
fails at once: a typo in a pool's address is a likely first mistake, and no waiting fixes it.
During a stream's outage (`iterator.py`) the name of a replaced pod may vanish for a while, so
only the first connect fails on it.
"""

from __future__ import annotations

import logging
import os
import time

from input_client import addresses
from input_client.tls import TlsSettings, host_port
from input_client.tls_diagnosis import Unreachable, diagnose

log = logging.getLogger("input_client")

# A socket file still missing after this long is said: a sidecar started alongside usually
# makes it within this (no warning then), and the user hears of it well within a second.
SAY_MISSING_AFTER_S = 0.3


def socket_file_ready(address: str, timeout_s: float) -> float:
    """Says at once what no waiting can fix, waits for a `unix:` socket file to appear (a
    server starting), and returns the time left of `timeout_s`.

    Raises:
      ConnectionError: a path without its `unix://`, a `unix:` path that is not a socket,
        or no socket there within the timeout.
    """
    if addresses.looks_like_a_path(address):
        path = os.path.abspath(address)
        there = "is a socket file" if addresses.is_socket(path) else "looks like a path"
        raise ConnectionError(
            f"no input server reachable at {address!r}: it {there}, and a Unix "
            f"socket needs its scheme: unix://{path}"
        )
    path = addresses.socket_path(address)
    if not path:
        return timeout_s
    start = time.monotonic()
    deadline, warned, appeared = start + timeout_s, False, False
    while not os.path.exists(path):
        appeared = True  # if it comes, made now: a server starting, not one that was killed
        now = time.monotonic()
        if now >= deadline:
            raise ConnectionError(
                f"no input server reachable at {address!r}: no socket at {path} "
                f"after {timeout_s:g} s; {where_instead(path)}"
            )
        if not warned and now - start >= SAY_MISSING_AFTER_S:
            # Said once, early, as a refused TCP connect is: the wait goes on (a server may
            # be starting), but a server at another default path is named now, not in 30 s.
            log.warning(
                "no socket at %s; waiting up to %g s for a server there: %s",
                path,
                timeout_s,
                where_instead(path),
            )
            warned = True
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    if not addresses.is_socket(path):
        raise ConnectionError(f"no input server reachable at {address!r}: {path} is not a socket.")
    if not appeared and addresses.nobody_answers(path, timeout_s=SAY_MISSING_AFTER_S):
        # A socket file left by a killed server: gRPC would retry it in silence until the
        # deadline. Said now, as a missing one is; the wait goes on for a restarted server.
        # One that appeared during the wait was bound by a server not yet listening.
        log.warning(
            "nobody answers on the socket file %s (left by a server that was killed?); "
            "waiting up to %g s for a server there: is `input-server serve` running?",
            path,
            timeout_s,
        )
    return max(0.0, deadline - time.monotonic())


def where_instead(path: str) -> str:
    """The hint for a missing socket file: the other default path where a server answers
    (a `serve` started with another XDG_RUNTIME_DIR or TMPDIR: tmux, an IDE, cron), else
    the question whether one runs."""
    elsewhere = addresses.servers_elsewhere(path)
    if not elsewhere:
        return "is `input-server serve` running?"
    return (
        f"a server is listening at the other default path unix://{elsewhere[0]} (started "
        f"with another XDG_RUNTIME_DIR or TMPDIR?); connect to unix://{elsewhere[0]}, or "
        f"run both with the same XDG_RUNTIME_DIR."
    )


class ConnectWait:
    """One client's wait for its server: `diagnose` is `wait_diagnosing`'s callback, and
    `timed_out()` the message when the wait ends unanswered.

    Args:
      address: the server's gRPC target.
      settings: the client's TLS settings (the diagnosis repeats its handshake).
      timeout_s: how long the wait lasts (said in its messages).
    """

    def __init__(self, address: str, settings: TlsSettings, timeout_s: float):
        self.address = address
        self.settings = settings
        self.timeout_s = timeout_s
        self.unreachable: Unreachable | None = None  # the last reason nothing answered

    def diagnose(self, timeout_s: float) -> str | None:
        """A TLS mistake, or a host name that does not exist: what ends the wait at once."""
        problem = diagnose(
            self.address, self.settings, timeout_s=timeout_s, on_unreachable=self._noted
        )
        if problem is not None:
            return problem
        u = self.unreachable
        if u is not None and u.final:
            return f"{u.words}: no input server at {self.address!r}; check the host name."
        return None

    def _noted(self, e: Unreachable) -> None:
        if not e.final and (self.unreachable is None or self.unreachable.words != e.words):
            # Said at once, once per reason: the wait may last `connect_timeout_s`.
            log.warning(
                "%s; waiting up to %g s for a server at %r: %s",
                e.words,
                self.timeout_s,
                self.address,
                self._hint(e),
            )
        self.unreachable = e

    def _hint(self, e: Unreachable) -> str:
        if "connection refused" in e.words:
            host, port = host_port(self.address) or ("HOST", 0)
            at = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            return f"is `input-server serve --listen {at}` running?"
        if e.words.startswith("cannot resolve"):
            return "check the host name (and the resolver)."
        return "check the address and the network."

    def timed_out(self) -> str:
        """The error when the wait ends unanswered, naming why when it is known."""
        path = addresses.socket_path(self.address)
        if path is not None and addresses.nobody_answers(path):
            hint = (
                f": nobody answers on the socket file {path} (left by a server that was "
                f"killed?); is `input-server serve` running?"
            )
        elif self.unreachable is not None:
            hint = f": {self.unreachable.words}; {self._hint(self.unreachable)}"
        else:
            hint = "."
        return f"no input server reachable at {self.address!r} after {self.timeout_s:g} s{hint}"
