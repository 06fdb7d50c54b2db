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
# Loopback TCP peers are told apart by the user owning the client's socket, read from the
# kernel's socket table (what identd does): a local user guessing on 127.0.0.1 then slows only
# that user. A connection's owner is remembered this long (its port is taken again only after
# it closes) for this many connections.
PROC_NET = {"ipv4": "/proc/net/tcp", "ipv6": "/proc/net/tcp6"}
OWNER_TTL_S = 5.0
OWNERS = 1024


def peer_key(peer: str, owners: LoopbackOwners | None = None) -> str:
    """Whom a backoff slows: the peer's host for TCP (an IPv6 host by its /64: a machine is
    given a whole /64 and could try each of its addresses in turn), on loopback with the user
    owning the client's socket when `owners` can tell; "unix" for every Unix-socket peer (gRPC
    tells none apart, `auth`'s docstring)."""
    kind, _, rest = peer.partition(":")
    if kind not in PROC_NET:
        return "unix" if kind == "unix" else peer
    host, _, port = rest.rpartition(":")
    host = urllib.parse.unquote(host).strip("[]")
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return f"{kind}:{host}"
    if address.is_loopback and owners is not None:
        uid = owners.uid(kind, address, int(port))
        if uid is not None:
            return f"{kind}:loopback uid {uid}"
    if address.version == 6:
        return f"ipv6:{ipaddress.IPv6Network((address, 64), strict=False)}"
    return f"ipv4:{address}"


class LoopbackOwners:
    """The user owning a loopback client's socket, from `/proc/net/tcp{,6}` (None where they
    cannot be read, e.g. another OS), remembered per connection for OWNER_TTL_S."""

    def __init__(self, *, ttl_s: float = OWNER_TTL_S, size: int = OWNERS):
        self._ttl_s, self._size = ttl_s, size
        self._lock = threading.Lock()
        self._known: dict[tuple, tuple[int | None, float]] = {}

    def uid(self, kind: str, address, port: int) -> int | None:
        key, now = (kind, address, port), time.monotonic()
        with self._lock:
            found = self._known.get(key)
        if found is not None and now - found[1] < self._ttl_s:
            return found[0]
        uid = socket_owner(PROC_NET[kind], address, port)
        if uid is None and address.version == 4:  # gRPC's dual-stack sockets: ::ffff:a.b.c.d
            mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed)
            uid = socket_owner(PROC_NET["ipv6"], mapped, port)
        with self._lock:
            self._known.pop(key, None)
            if len(self._known) >= self._size:
                self._known.pop(next(iter(self._known)))
            self._known[key] = (uid, now)
        return uid


def socket_owner(table: str, address, port: int) -> int | None:
    """The uid owning the socket whose local end is `address`:`port` in `table`, or None."""
    packed = address.packed  # /proc writes each 32-bit word in the host's (little) byte order
    words = (packed[i : i + 4][::-1].hex().upper() for i in range(0, len(packed), 4))
    needle = f": {''.join(words)}:{port:04X} "  # the local column follows the slot's "N: "
    try:
        with open(table) as f:
            text = f.read()
    except OSError:
        return None
    at = text.find(needle)
    if at < 0:
        return None
    fields = text[at : text.find("\n", at)].split()
    # fields: local, remote, state, queues, timer, retransmits, uid
    return int(fields[7]) if len(fields) > 7 and fields[7].isdigit() else None


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
        self._quiet_from = 0.0  # from then on no peer waits: a right token needs no lookup

    def quiet(self) -> bool:
        """Whether no peer is in backoff now."""
        return time.monotonic() >= self._quiet_from

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
            self._quiet_from = max(self._quiet_from, now + delay)
            return None

    def __len__(self) -> int:
        return len(self._seen)
