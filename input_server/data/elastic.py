"""A resharded stream's documents: a run's old hosts' unused documents, then a fresh shard.

A run's hosts saved their states on `c` hosts and go on with `c'` (`input_client.reshard`).
New stream `k` of `n` (its deal; a host's own shard, or one of its fanned-in sub-shards)
reads, per component:

1. for each epoch some old stream had begun (up to the last one any had begun, counting an
   earlier reshard's too), the list R_e of that epoch's documents no old stream had used: the
   documents old streams had partly used first (each with its tokens used, its head), then
   each old stream's unused ones, in old stream order, each in its own order; stream k takes
   `R_e[k::n]`;
2. then the epochs after those from its own shard's order (`DocumentOrder` of the spec's
   shard), from the first untouched epoch on.

The old streams' documents partition each epoch and the deal partitions R_e, so every
document of every begun epoch is read once over the old and new streams, and later epochs
are sharded by the new count. An old stream can itself be resharded (a second change before
its documents ran out): its epochs are counted through its own `epoch_range`, as a
`DocumentOrder`'s are.

Everything here is a pure function of the old positions and the deal: a few integers per
old stream, and the old streams' own orders for the documents (their permutations:
`held_bytes` counts them). R_e is never written out whole: 4,096 old streams 64 epochs apart
in 16 components are 4 M segments (3.4 s of CPU and 220 MB a request, when it was). Setting
up takes each begun epoch's size and heads, a few numpy calls over the old streams an epoch;
an epoch's segments are computed when its documents are read, and the last two kept.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from input_server.data.order import FOREVER, DocumentOrder, LockedCache, Order
from input_server.errors import InvalidSpecError

# Epochs the old streams may lie across (one ahead of another drifted past an epoch's end):
# each holds a few integers an old stream, and a forged state could name millions.
MAX_EPOCHS_APART = 64
# The most a resharded stream's later ordinals start at: resume states' `doc` stays below
# 2^63 - 2^40 (`batching.resume.MAX_DOC`), and int64 arithmetic must not wrap before that.
MAX_ORDINAL = 1 << 62
# Old streams that are themselves resharded (a state resharded again before its host read
# what it was dealt) have no closed form for their epochs: each costs a call an epoch, so
# their count times the epochs spanned is bounded (2^15 calls: about 40 ms here). An honest
# second change names as many as the hosts of the first.
MAX_NESTED_EPOCHS = 1 << 15


def heads_of(order: Order) -> dict[int, int]:
    """The documents of `order` whose first tokens an earlier stream used (ordinal ->
    tokens): a resharded order's, mapped through a mixture's interleave."""
    return order.used_heads()


@dataclasses.dataclass(frozen=True)
class Old:
    """An old stream of one component: its order, its next unused document and the tokens
    of it used (its head: 0 if none)."""

    order: DocumentOrder | ReshardedOrder
    next: int
    head: int = 0


class _Epoch(NamedTuple):
    """R_e as segments of old streams' ordinals, end to end: the partly used documents first
    (a segment of one each, with its head), then each old stream's unused run."""

    old: np.ndarray  # the old stream of each segment
    lo: np.ndarray  # its first ordinal there
    start: np.ndarray  # where it starts in R_e
    head: np.ndarray  # tokens used of it (partly used ones), else 0
    begun: int  # how many partly used documents lead
    size: int  # documents of R_e


class ReshardedOrder(LockedCache, Order):
    """Maps a resharded stream's ordinals to source indices (see the module's rule).

    Args:
      olds: every old stream of this component.
      deal: (k, n): this stream takes `R_e[k::n]` of each begun epoch's unused documents.
      fresh: this stream's own shard's order, for the epochs after those.
      pace: called between epochs while setting up (the caller's CPU budget and fair share:
        `batching.resharded`); None: not paced.
    """

    def __init__(
        self,
        olds: list[Old],
        deal: tuple[int, int],
        fresh: DocumentOrder,
        pace: Callable[[], None] | None = None,
    ):
        self.olds, self.fresh = olds, fresh
        self.k, self.n = deal
        self.shuffle, self.epochs, self.per_epoch = fresh.shuffle, fresh.epochs, fresh.per_epoch
        self._columns()
        self.last, self.first = self._span()
        self._cache: dict[int, _Epoch] = {}
        self._lock = threading.Lock()
        self._sizes(pace or (lambda: None))

    def _columns(self) -> None:
        """Each old stream's next document, head, documents an epoch and length, as arrays:
        a plain shard's epochs are those of its own arithmetic (`DocumentOrder`)."""
        m, olds = len(self.olds), self.olds
        self._next = np.fromiter((o.next for o in olds), np.int64, m)
        self._head = np.fromiter((o.head for o in olds), np.int64, m)
        self._per = np.fromiter((o.order.per_epoch for o in olds), np.int64, m)
        self._len = np.fromiter((min(len(o.order), FOREVER) for o in olds), np.int64, m)
        self._nested = [i for i, o in enumerate(olds) if o.order.resharded]

    def _epochs_of(self, x: np.ndarray) -> np.ndarray:
        """The epoch of each old stream's document `x[i]` (each at least 0)."""
        e = x // np.maximum(self._per, 1)
        for i in self._nested:
            e[i] = self.olds[i].order.epoch_of(int(x[i]))
        return e

    def _span(self) -> tuple[int, int]:
        """The last epoch some old stream (or one before it, resharded) began, and the first
        one some old stream had not finished; refused when too far apart or too late."""
        nxt, head = self._next, self._head
        at = self._epochs_of(np.where(head > 0, nxt, np.maximum(nxt - 1, 0)))
        touched = np.where((head > 0) | (nxt > 0), at, -1)
        for i in self._nested:
            touched[i] = max(int(touched[i]), self.olds[i].order.last)
        last = int(touched.max(initial=-1))
        open_ = nxt < self._len
        first = int(self._epochs_of(np.where(open_, nxt, 0))[open_].min(initial=last + 1))
        if last - first >= MAX_EPOCHS_APART:
            raise InvalidSpecError(
                f"`resume_state`'s old hosts stand {last - first + 1} epochs apart "
                f"(epochs {first} to {last}); a resharded state spans at most "
                f"{MAX_EPOCHS_APART}."
            )
        per = max(self.per_epoch, int(self._per.max(initial=0)))
        if (last + 1) * per >= MAX_ORDINAL:
            raise InvalidSpecError(
                f"`resume_state`'s old hosts stand in epoch {last:,}: its documents' "
                f"ordinals would pass {MAX_ORDINAL:,}."
            )
        if len(self._nested) * (last - first + 1) > MAX_NESTED_EPOCHS:
            raise InvalidSpecError(
                f"`resume_state` holds {len(self._nested):,} old streams resharded before "
                f"over {last - first + 1} epochs, over the {MAX_NESTED_EPOCHS:,} a resharded "
                f"state may make the server walk: resume on the last host count until its "
                f"hosts have read what the earlier change dealt them."
            )
        return last, first

    def _epoch(self, e: int) -> _Epoch:
        """R_e (`first <= e <= last`), computed from the old streams' positions."""
        lo = np.minimum(e * self._per, self._len)
        hi = np.minimum((e + 1) * self._per, self._len)
        for i in self._nested:
            lo[i], hi[i] = self.olds[i].order.epoch_range(e)
        partly = (self._head > 0) & (lo <= self._next) & (self._next < hi)
        lo = np.maximum(lo, self._next + partly)
        length = np.maximum(hi - lo, 0)
        begun, rest = np.flatnonzero(partly), np.flatnonzero(length)
        seg_len = np.concatenate([np.ones(len(begun), np.int64), length[rest]])
        return _Epoch(
            old=np.concatenate([begun, rest]),
            lo=np.concatenate([self._next[begun], lo[rest]]),
            start=np.cumsum(seg_len) - seg_len,
            head=np.concatenate([self._head[begun], np.zeros(len(rest), np.int64)]),
            begun=len(begun),
            size=int(seg_len.sum()),
        )

    def _cached(self, e: int) -> _Epoch:
        """R_e for reading: the last two epochs' kept (a group can straddle an epoch's end)."""
        with self._lock:
            got = self._cache.get(e)
            if got is None:
                if len(self._cache) >= 2:
                    del self._cache[min(self._cache)]
                got = self._cache[e] = self._epoch(e)
            return got

    def _sizes(self, pace: Callable[[], None]) -> None:
        """Each begun epoch's share of this stream and the heads of its documents: its own
        partly used ones, and those an earlier reshard gave the old streams' unused ones."""
        nested = {}  # epoch -> [(old stream, its ordinal, head)]
        for i in self._nested:
            order = self.olds[i].order
            for j, h in order.used_heads().items():
                nested.setdefault(order.epoch_of(j), []).append((i, j, h))
        r_start, a_start, heads = [], [], {}
        r, a = 0, 0
        for e in range(self.first, self.last + 1):
            pace()
            r_start.append(r)
            a_start.append(a)
            t = self._epoch(e)
            places = {p: int(t.head[p]) for p in range(t.begun)}
            for i, j, h in nested.get(e, ()):
                s = np.flatnonzero(t.old[t.begun :] == i) + t.begun
                if len(s) and t.lo[s[0]] <= j:  # one unused run per old stream an epoch
                    places[int(t.start[s[0]] + j - t.lo[s[0]])] = h
            for p, h in places.items():
                if p >= self.k and (p - self.k) % self.n == 0:
                    heads[a + (p - self.k) // self.n] = h
            r += t.size
            a += len(range(self.k, t.size, self.n))
        self._r_start = np.asarray(r_start, np.int64)
        self._a_start = np.asarray(a_start, np.int64)
        self.dealt = a  # this stream's documents of the begun epochs
        self.heads = heads

    resharded = True  # its epochs are asked of it (`epoch_of`, `epoch_range`)

    def __len__(self) -> int:
        if not self.epochs:
            return FOREVER
        return self.dealt + max(0, self.epochs - 1 - self.last) * self.per_epoch

    def used_heads(self) -> dict[int, int]:
        """Its documents whose first tokens an old stream used (ordinal -> tokens)."""
        return dict(self.heads)

    def settled_at(self, doc: int) -> tuple[int, None] | None:
        """Its document `doc` as its own shard's ordinal once past those it was dealt (the
        ones after are that shard's, from the first untouched epoch on); None before."""
        if doc < self.dealt:
            return None
        return doc - self.dealt + (self.last + 1) * self.per_epoch, None

    def held_bytes(self) -> int:
        """What its orders' permutations hold at most: the old streams' and its own."""
        return self.fresh.held_bytes() + sum(o.order.held_bytes() for o in self.olds)

    def epoch_range(self, e: int) -> tuple[int, int]:
        if e < self.first:
            return 0, 0
        if e <= self.last:
            i = e - self.first
            hi = self._a_start[i + 1] if i + 1 < len(self._a_start) else self.dealt
            return int(self._a_start[i]), int(hi)
        lo = self.dealt + (e - self.last - 1) * self.per_epoch
        return min(lo, len(self)), min(lo + self.per_epoch, len(self))

    def epoch_of(self, x: int) -> int:
        if x >= self.dealt:
            return self.last + 1 + (x - self.dealt) // self.per_epoch
        return self.first + int(np.searchsorted(self._a_start, x, side="right")) - 1

    def source_indices(self, start: int, stop: int) -> np.ndarray:
        """Source record indices of stream documents `[start, stop)`."""
        return self.indices_of(np.arange(start, min(stop, len(self)), dtype=np.int64))

    def indices_of(self, ordinals: np.ndarray) -> np.ndarray:
        """Source record indices of the stream documents `ordinals`."""
        out = np.empty(len(ordinals), np.int64)
        dealt = ordinals < self.dealt
        if dealt.any():
            out[dealt] = self._dealt_indices(ordinals[dealt])
        if not dealt.all():
            x = ordinals[~dealt] - self.dealt + (self.last + 1) * self.per_epoch
            out[~dealt] = self.fresh.indices_of(x)
        return out

    def _dealt_indices(self, x: np.ndarray) -> np.ndarray:
        """Source record indices of its documents `x` of the begun epochs."""
        e = np.searchsorted(self._a_start, x, side="right") - 1
        place = self.k + self.n * (x - self._a_start[e])  # in R_e
        got = np.empty(len(x), np.int64)
        for i in np.unique(e).tolist():
            mine = e == i
            t = self._cached(self.first + i)
            s = np.searchsorted(t.start, place[mine], side="right") - 1
            old, at = t.old[s], t.lo[s] + place[mine] - t.start[s]
            part = np.empty(len(s), np.int64)
            for o in np.unique(old).tolist():
                which = old == o
                part[which] = self.olds[o].order.indices_of(at[which])
            got[mine] = part
        return got
