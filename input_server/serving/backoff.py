"""Wrong tokens slow their sender: per peer, a delay that doubles with each wrong token, during
which the peer's token is not checked (`auth.TokenCheck` refuses its calls at once).

Why refuse rather than wait: gRPC Python's sync server runs a call on a pool thread, so a call
made to wait holds a thread the other clients need, and a guesser sends as many as it likes
side by side. Why refuse a right token too: one answered at once while the wrong ones wait
would tell a guesser which of the guesses it sent side by side was right.
"""

from __future__ import annotations

import ipaddress
import threading
import time
import urllib.parse

# The backoff on wrong tokens (`Backoff`). A peer's first FREE_FAILURES wrong tokens are
# answered at once (a mistyped token file is fixed and retried); each one more makes the peer
# wait BACKOFF_BASE_S, doubled each time up to BACKOFF_MAX_S, before its token is checked
# again: a steady guesser gets one check every BACKOFF_MAX_S (it made 1,442 a second on one
# channel). A peer whose last wrong token is BACKOFF_FORGET_S old starts afresh.
FREE_FAILURES = 4
BACKOFF_BASE_S = 0.05
BACKOFF_MAX_S = 5.0
BACKOFF_FORGET_S = 60.0
# Peers whose wrong tokens are remembered (~200 bytes each): past it the least recently wrong
# are forgotten, which frees them of their backoff.
BACKOFF_PEERS = 4096


def peer_key(peer: str) -> str:
    """Whom a backoff slows: the peer's host for TCP (an IPv6 host by its /64: a machine is
    given a whole /64 and could try each of its addresses in turn), "unix" for every Unix-socket
    peer (gRPC tells none apart, `auth`'s docstring)."""
    if peer.startswith("ipv6:"):
        host = urllib.parse.unquote(peer[5:].rsplit(":", 1)[0]).strip("[]")
        try:
            return f"ipv6:{ipaddress.IPv6Network((host.split('%')[0], 64), strict=False)}"
        except ValueError:
            return peer.rsplit(":", 1)[0]
    if peer.startswith("ipv4:"):
        return peer.rsplit(":", 1)[0]
    return "unix" if peer.startswith("unix") else peer


class Backoff:
    """Wrong tokens by peer, and when each peer's token may be checked again.

    A peer's wrong tokens past `free` each set its next check `base_s` later, doubled each
    time up to `max_s`; until then every call of the peer is refused unchecked. A peer whose
    last wrong token is `forget_s` old starts afresh; at most `peers` are remembered, the least
    recently wrong forgotten first. Nothing here sleeps: gRPC's threads answer at once.
    """

    def __init__(
        self,
        *,
        free: int = FREE_FAILURES,
        base_s: float = BACKOFF_BASE_S,
        max_s: float = BACKOFF_MAX_S,
        forget_s: float = BACKOFF_FORGET_S,
        peers: int = BACKOFF_PEERS,
    ):
        self._free, self._base_s, self._max_s = free, base_s, max_s
        self._forget_s, self._peers = forget_s, peers
        self._lock = threading.Lock()
        # key: (wrong tokens, the last one's time, next check's time); least recently wrong first
        self._seen: dict[str, tuple[int, float, float]] = {}

    def admit(self, key: str, right: bool) -> float | None:
        """Checks a call of peer `key`: None when its token was checked (`right` says how it
        came out; a wrong one is counted), else the seconds until the peer's next check."""
        now = time.monotonic()
        with self._lock:
            wrong, last, next_at = self._seen.get(key, (0, now, now))
            if now - last >= self._forget_s:
                wrong, next_at = 0, now
            if now < next_at:
                return next_at - now
            if right:
                return None
            wrong += 1
            extra = min(wrong - self._free, 64)  # 2**64 x base is past any max
            delay = 0.0 if extra <= 0 else min(self._base_s * 2 ** (extra - 1), self._max_s)
            self._seen.pop(key, None)  # to the end: the most recently wrong
            if len(self._seen) >= self._peers:
                self._seen.pop(next(iter(self._seen)))
            self._seen[key] = (wrong, now, now + delay)
            return None

    def __len__(self) -> int:
        return len(self._seen)
