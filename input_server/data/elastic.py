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
old stream and epoch, and the old streams' own orders for the documents (their
permutations: `held_bytes` counts them).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from input_server.data.mixture import MixtureOrder
from input_server.data.order import _FOREVER, DocumentOrder
from input_server.errors import InvalidSpecError

# Epochs the old streams may lie across (one ahead of another drifted past an epoch's end):
# each holds a few integers an old stream, and a forged state could name millions.
MAX_EPOCHS_APART = 64
# The most a resharded stream's later ordinals start at: resume states' `doc` stays below
# 2^63 - 2^40 (`batching.resume.MAX_DOC`), and int64 arithmetic must not wrap before that.
MAX_ORDINAL = 1 << 62


def heads_of(order) -> dict[int, int]:
    """The documents of `order` whose first tokens an earlier stream used (ordinal ->
    tokens): a resharded order's, mapped through a mixture's interleave."""
    if isinstance(order, ReshardedOrder):
        return dict(order.heads)
    if not isinstance(order, MixtureOrder):
        return {}
    sched, at, out = order.schedule, order.at, {}
    for c, comp in enumerate(order.components):
        for j, h in heads_of(comp).items():
            if j >= at.bases[c]:
                x = sched.position_of(c, j - at.bases[c]) - at.origin
                if 0 <= x < len(order):
                    out[x] = h
    return out


@dataclasses.dataclass(frozen=True)
class Old:
    """An old stream of one component: its order, its next unused document and the tokens
    of it used (its head: 0 if none)."""

    order: object  # DocumentOrder | ReshardedOrder
    next: int
    head: int = 0

    def touched(self) -> int:
        """The last epoch this stream (or one before it, resharded) began: -1 if none."""
        if self.head:
            last = self.order.epoch_of(self.next)
        else:
            last = self.order.epoch_of(self.next - 1) if self.next else -1
        return max(last, self.order.last)


class ReshardedOrder:
    """Maps a resharded stream's ordinals to source indices (see the module's rule).

    Args:
      olds: every old stream of this component.
      deal: (k, n): this stream takes `R_e[k::n]` of each begun epoch's unused documents.
      fresh: this stream's own shard's order, for the epochs after those.
    """

    def __init__(self, olds: list[Old], deal: tuple[int, int], fresh: DocumentOrder):
        self.olds, self.fresh = olds, fresh
        self.k, self.n = deal
        self.shuffle, self.epochs, self.per_epoch = fresh.shuffle, fresh.epochs, fresh.per_epoch
        self.last = max((o.touched() for o in olds), default=-1)
        ends = [o.order.epoch_of(o.next) for o in olds if o.next < len(o.order)]
        self.first = min(ends, default=self.last + 1)
        if self.last - self.first >= MAX_EPOCHS_APART:
            raise InvalidSpecError(
                f"`resume_state`'s old hosts stand {self.last - self.first + 1} epochs apart "
                f"(epochs {self.first} to {self.last}); a resharded state spans at most "
                f"{MAX_EPOCHS_APART}."
            )
        if (self.last + 1) * fresh.per_epoch >= MAX_ORDINAL:
            raise InvalidSpecError(
                f"`resume_state`'s old hosts stand in epoch {self.last:,}: its documents' "
                f"ordinals would pass {MAX_ORDINAL:,}."
            )
        self._segments()
        self.heads = self._heads()

    def _segments(self) -> None:
        """R_e of every begun epoch as segments of old streams' ordinals, end to end: (old
        stream, first ordinal, length, head), a partly used document a segment of its own."""
        segments = []
        r_start, a_start = [], []  # per epoch: where R_e starts, and this stream's share
        r, a = 0, 0
        for e in range(self.first, self.last + 1):
            r_start.append(r)
            a_start.append(a)
            begun, rest = [], []
            for i, o in enumerate(self.olds):
                lo, hi = o.order.epoch_range(e)
                partly = bool(o.head) and lo <= o.next < hi
                if partly:
                    begun.append((i, o.next, 1, o.head))
                lo = max(lo, o.next + partly)
                if hi > lo:
                    rest.append((i, lo, hi - lo, 0))
            segments += begun + rest
            size = sum(length for _, _, length, _ in begun + rest)
            r += size
            a += len(range(self.k, size, self.n))
        columns = np.asarray(segments, np.int64).reshape(-1, 4).T
        self._seg_old, self._seg_lo, self._seg_len, self._seg_head = columns
        self._seg_start = np.cumsum(self._seg_len) - self._seg_len
        self._r_start = np.asarray(r_start, np.int64)
        self._a_start = np.asarray(a_start, np.int64)
        self.dealt = a  # this stream's documents of the begun epochs

    def __len__(self) -> int:
        if not self.epochs:
            return _FOREVER
        return self.dealt + max(0, self.epochs - 1 - self.last) * self.per_epoch

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

    def _dealt_place(self, places: np.ndarray) -> np.ndarray:
        """This stream's ordinals of places in R (all epochs end to end), -1 for others'."""
        e = np.searchsorted(self._r_start, places, side="right") - 1
        p = places - self._r_start[e]
        mine = p % self.n == self.k
        return np.where(mine, self._a_start[e] + (p - self.k) // self.n, -1)

    def _heads(self) -> dict[int, int]:
        """Its documents old streams had begun: their own partly used ones, and the heads an
        earlier reshard gave their unused ones."""
        out, partial = {}, self._seg_head > 0
        for s in np.flatnonzero(partial).tolist():
            x = int(self._dealt_place(self._seg_start[s : s + 1])[0])
            if x >= 0:
                out[x] = int(self._seg_head[s])
        ends = self._seg_lo + self._seg_len
        for i, o in enumerate(self.olds):
            for j, h in heads_of(o.order).items():
                holds = (self._seg_old == i) & ~partial & (self._seg_lo <= j) & (j < ends)
                for s in np.flatnonzero(holds).tolist():
                    place = self._seg_start[s : s + 1] + j - self._seg_lo[s]
                    x = int(self._dealt_place(place)[0])
                    if x >= 0:
                        out[x] = h
        return out

    def source_indices(self, start: int, stop: int) -> np.ndarray:
        """Source record indices of stream documents `[start, stop)`."""
        return self.indices_of(np.arange(start, min(stop, len(self)), dtype=np.int64))

    def indices_of(self, ordinals: np.ndarray) -> np.ndarray:
        """Source record indices of the stream documents `ordinals`."""
        out = np.empty(len(ordinals), np.int64)
        dealt = ordinals < self.dealt
        if dealt.any():
            x = ordinals[dealt]
            e = np.searchsorted(self._a_start, x, side="right") - 1
            place = self._r_start[e] + self.k + self.n * (x - self._a_start[e])
            s = np.searchsorted(self._seg_start, place, side="right") - 1
            old, at = self._seg_old[s], self._seg_lo[s] + place - self._seg_start[s]
            got = np.empty(len(x), np.int64)
            for i in np.unique(old).tolist():
                mask = old == i
                got[mask] = self.olds[i].order.indices_of(at[mask])
            out[dealt] = got
        if not dealt.all():
            x = ordinals[~dealt] - self.dealt + (self.last + 1) * self.per_epoch
            out[~dealt] = self.fresh.indices_of(x)
        return out
