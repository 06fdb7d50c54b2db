"""Weighted mixtures: which component gives the stream's n-th document, and which of its own.

Weights count documents, as Grain's `mix` and MaxText's mixtures do. They become integer
quotas of a period (exact where the weights are ratios of small integers, 0.3 : 0.7 -> 3 : 7;
else shares of 2^16 documents), and a period is one interleave of every component's quota,
each component's occurrences spread evenly (the k-th of a component with quota q sits at
(k + 1/2) / q of the period, ties to the lower component). So a component's count in any
window stays within a document or two of its share, and the whole map is a pure function of
the ordinal: a range of ordinals is computed in a few numpy calls, in any process, for any
worker count, with no state to carry but where the stream stands.

Each component keeps its own shuffled, repeating order (`DocumentOrder`, seeded by the
component). With finite `order.epochs`, the mixture ends where its first component runs out
(its epochs' documents used), as Grain's mix stops at its first exhausted input.

A stream resumed under other weights (every component named, nothing else changed) keeps
each component where it was: `rebased` gives the new interleave an origin and per-component
bases so that component c's next document is the one it would have read next.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from input_client.spec import MIX_PERIOD
from input_server.data.order import FOREVER, DocumentOrder, MixPosition, Order, OrderBudget
from input_server.errors import InvalidSpecError


def quotas(weights: Sequence[float]) -> tuple[int, ...]:
    """Integer documents per period for each weight: their exact ratio when the weights are
    ratios of integers whose sum is at most MIX_PERIOD, else the largest-remainder shares of
    MIX_PERIOD (validation keeps every share at 1/MIX_PERIOD or more)."""
    fractions = [Fraction(w).limit_denominator(MIX_PERIOD) for w in weights]
    if all(float(f) == float(w) for f, w in zip(fractions, weights, strict=True)):
        common = math.lcm(*(f.denominator for f in fractions))
        q = [int(f * common) for f in fractions]
        g = math.gcd(*q)
        q = [x // g for x in q]
        if sum(q) <= MIX_PERIOD:
            return tuple(q)
    total = math.fsum(weights)
    raw = [w / total * MIX_PERIOD for w in weights]
    q = [max(1, int(r)) for r in raw]
    by_remainder = sorted(range(len(q)), key=lambda i: (q[i] - raw[i], i))
    for i in by_remainder[: max(0, MIX_PERIOD - sum(q))]:
        q[i] += 1
    while sum(q) > MIX_PERIOD:  # shares rounded up to 1 took a document from the largest
        q[q.index(max(q))] -= 1
    return tuple(q)


class Schedule:
    """One period of the interleave: the component at each position, and each occurrence's
    rank within its component."""

    def __init__(self, q: Sequence[int]):
        q = np.asarray(q, np.int64)
        self.quotas = q
        self.period = int(q.sum())
        comp = np.repeat(np.arange(len(q)), q)
        rank = np.arange(self.period) - np.repeat(np.cumsum(q) - q, q)
        # The k-th occurrence of a component at (k + phase) / q. Components of one quota would
        # all fall on the same places (one dominant weight and 39 equal ones came in bursts of
        # 39, 15 documents off in a window), so the j-th of m sharing a quota takes phase
        # (j + 1/2) / m: they take turns, evenly spread. A pure function of the quotas.
        phase = np.empty(len(q))
        for quota in np.unique(q):
            same = np.flatnonzero(q == quota)
            phase[same] = (np.arange(len(same)) + 0.5) / len(same)
        at = np.lexsort((comp, (rank + phase[comp]) / q[comp]))
        self.comp = comp[at]
        self.rank = rank[at]
        where = np.empty(self.period, np.int64)
        where[at] = np.arange(self.period)
        # Each component's positions in the period, in order (its occurrences' ranks rise
        # with their positions): component c's are where[starts[c]:starts[c] + q[c]].
        self._where = where
        self._starts = np.cumsum(q) - q

    def positions(self, c: int) -> np.ndarray:
        return self._where[self._starts[c] : self._starts[c] + self.quotas[c]]

    def count_before(self, c: int, s: int) -> int:
        """Occurrences of component c at schedule positions below `s`."""
        cycles, within = divmod(s, self.period)
        return cycles * int(self.quotas[c]) + int(np.searchsorted(self.positions(c), within))

    def position_of(self, c: int, j: int) -> int:
        """The schedule position of component c's j-th occurrence (from 0)."""
        cycles, r = divmod(j, int(self.quotas[c]))
        return cycles * self.period + int(self.positions(c)[r])


@functools.lru_cache(maxsize=16)
def _schedule(quotas: tuple[int, ...]) -> Schedule:
    """One schedule per quotas, shared (a resharded state's old hosts' orders have the same
    quotas: building a period of up to MIX_PERIOD places each time took seconds)."""
    return Schedule(quotas)


class MixtureOrder(Order):
    """Maps stream ordinals to source indices across the components of a mixture.

    Picklable and cheap to send; the schedule is built in each process that reads.

    Args:
      components: each component's own document order (shard, shuffle, epochs).
      offsets: the source index of each component's first record (`DocumentSource` holds
        every component's files, one after another).
      at: the interleave's quotas, origin and bases.
    """

    def __init__(self, components: Sequence[Order], offsets: Sequence[int], at: MixPosition):
        self._components = list(components)
        self.offsets = np.asarray(offsets, np.int64)
        self.at = dataclasses.replace(at, bases=at.bases or (0,) * len(self.components))
        self._schedule: Schedule | None = None
        self._len = self._length()

    def __getstate__(self):
        return {**self.__dict__, "_schedule": None}

    @property
    def components(self) -> list[Order]:
        """Each component's own order (a shard's, or a resharded state's)."""
        return self._components

    @property
    def resharded(self) -> bool:
        """Whether a component continues old streams' documents (a resharded state's)."""
        return any(c.resharded for c in self.components)

    @property
    def schedule(self) -> Schedule:
        if self._schedule is None:
            self._schedule = _schedule(tuple(self.at.quotas))
        return self._schedule

    @property
    def per_epoch(self) -> int:
        """Documents of one pass over every component (for reporting)."""
        return sum(c.per_epoch for c in self.components)

    def __len__(self) -> int:
        return self._len

    def held_bytes(self) -> int:
        """The most its components' permutations hold at once (a resharded one's old hosts'
        too)."""
        return sum(c.held_bytes() for c in self.components)

    def _length(self) -> int:
        """Ordinals before the first component runs out; a very large number forever."""
        if not self.components[0].epochs:
            return FOREVER
        sched, origin = self.schedule, self.at.origin
        ends = [
            sched.position_of(c, len(order) - self.at.bases[c]) - origin
            for c, order in enumerate(self.components)
        ]
        return min(FOREVER, max(0, min(ends)))

    def locate(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """For stream documents `[start, stop)`: each one's component and its ordinal there."""
        sched = self.schedule
        s = np.arange(start, min(stop, len(self)), dtype=np.int64) + self.at.origin
        cycles, within = np.divmod(s, sched.period)
        comp = sched.comp[within]
        bases = np.asarray(self.at.bases, np.int64)
        return comp, bases[comp] + cycles * sched.quotas[comp] + sched.rank[within]

    def source_indices(self, start: int, stop: int) -> np.ndarray:
        """Source record indices of stream documents `[start, stop)`."""
        comp, ordinal = self.locate(start, stop)
        out = np.empty(len(comp), np.int64)
        # A component's documents in a range of the stream are consecutive ordinals of its
        # own (each occurrence is the next), so each takes one range of its order: with 40
        # components, 60 us a group of 950 where masks and index arrays took 2.8 ms.
        at = np.argsort(comp, kind="stable")
        counts = np.bincount(comp, minlength=len(self.components))
        first_ordinals = ordinal[at]
        first = 0
        for c in np.flatnonzero(counts).tolist():
            n = int(counts[c])
            k = int(first_ordinals[first])
            indices = self.components[c].source_indices(k, k + n)
            out[at[first : first + n]] = self.offsets[c] + indices
            first += n
        return out

    def next_ordinals(self, doc: int) -> list[int]:
        """Each component's next document ordinal once stream document `doc` is next."""
        sched, s = self.schedule, self.at.origin + doc
        return [self.at.bases[c] + sched.count_before(c, s) for c in range(len(self.components))]

    def rebased(self, new_quotas: Sequence[int], doc: int, offset: int) -> MixPosition:
        """The position under `new_quotas` that continues this order's stream at document
        `doc` (`offset` of its tokens used): each component's next document stays its next,
        and a document begun (offset > 0) comes first, its offset kept."""
        nexts = self.next_ordinals(doc)
        new = Schedule(new_quotas)
        origin = 0
        if offset and doc < len(self):
            begun = int(self.locate(doc, doc + 1)[0][0])
            origin = new.position_of(begun, 0)
        bases = tuple(n - new.count_before(c, origin) for c, n in enumerate(nexts))
        return MixPosition(tuple(int(q) for q in new_quotas), origin, bases)

    def moved(self, at: MixPosition) -> MixtureOrder:
        """The same components under another interleave position."""
        return MixtureOrder(self.components, self.offsets.tolist(), at)

    def with_components(self, parts: Sequence[Order]) -> MixtureOrder:
        """The same mixture over `parts` (one a component), its interleave at its start."""
        return MixtureOrder(parts, self.offsets.tolist(), MixPosition(self.at.quotas))

    def component_positions(self, doc: int, offset: int) -> list[tuple[int, int]]:
        """Each component's next document once stream document `doc` is next, and the
        tokens used of the one it stands in (`offset`; the others' 0)."""
        if doc == 0 and self.at.origin == 0:  # at its interleave's start: its bases
            nexts = list(self.at.bases)
        else:
            nexts = self.next_ordinals(doc)
        begun = -1
        if offset and doc < len(self):
            begun = int(self.locate(doc, doc + 1)[0][0])
        return [(n, offset if c == begun else 0) for c, n in enumerate(nexts)]

    def used_heads(self) -> dict[int, int]:
        """Its components' documents whose first tokens an earlier stream used, mapped
        through the interleave (ordinal -> tokens)."""
        sched, at, out = self.schedule, self.at, {}
        for c, comp in enumerate(self.components):
            for j, h in comp.used_heads().items():
                if j >= at.bases[c]:
                    x = sched.position_of(c, j - at.bases[c]) - at.origin
                    if 0 <= x < len(self):
                        out[x] = h
        return out

    def settled_at(self, doc: int) -> tuple[int, MixPosition] | None:
        """Stream document `doc` as a plain interleave of its components' own shards once
        each is past what it was dealt (None before): the same schedule position as its
        origin, so component c's next document is its shard's ordinal of the one it would
        read next."""
        nexts = self.next_ordinals(doc)
        owns = [p.settled_at(n) for n, p in zip(nexts, self.components, strict=True)]
        if any(own is None for own in owns):
            return None
        sched = self.schedule
        origin = (self.at.origin + doc) % sched.period
        bases = tuple(own[0] - sched.count_before(c, origin) for c, own in enumerate(owns))
        return 0, MixPosition(self.at.quotas, origin, bases)


def component_seed(seed: int, c: int, name: str) -> int:
    """Component c's own shuffle seed: from its name when it has one (so a named component
    keeps its order wherever it stands in the list), else from its place."""
    blob = f"{seed}\0{name}" if name else f"{seed}\0#{c}"
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "little") >> 1


def order_for(
    spec,
    components: Sequence[tuple[int, int]],
    budget: OrderBudget | None = None,
    *,
    shard=None,
) -> DocumentOrder | MixtureOrder:
    """The document order of `spec` over a source whose component c is the records
    `components[c]` (start, count): one source's `DocumentOrder` as it always was, or a
    mixture of each component's own. Its permutations are computed lazily, so `budget` is
    checked here, before any is.

    Raises:
      InvalidSpecError: a shard holds none of a component's documents.
      OverBudgetError: its permutations would hold more than `budget` allows.

    `shard`: the order of that shard instead of the spec's (a resharded state's old hosts).
    """
    shard, o = shard or spec.shard, spec.order

    def one(count: int, seed: int, key: str) -> DocumentOrder:
        order = DocumentOrder(
            num_records=count,
            shard_index=shard.index,
            shard_count=shard.count,
            seed=seed,
            shuffle=o.shuffle,
            epochs=o.epochs,
        )
        if order.per_epoch == 0:
            raise InvalidSpecError(
                f"`shard.index` {shard.index} of `shard.count` {shard.count} holds no documents "
                f"of `{key}` ({count} in all); use fewer shards."
            )
        return order

    if not spec.is_mixture:
        order = one(components[0][1], o.seed, "source")
        if budget is not None:
            budget.check([order], "")
        return order
    orders = [
        one(count, component_seed(o.seed, c, s.name), f"source[{c}]")
        for c, (s, (_, count)) in enumerate(zip(spec.sources, components, strict=True))
    ]
    if budget is not None:
        budget.check(orders, f" over {len(orders):,} components")
    at = MixPosition(quotas([s.weight for s in spec.sources]))
    return MixtureOrder(orders, [start for start, _ in components], at)


def component_fingerprints(spec) -> list[list[str]]:
    """[name, fingerprint] of each component (`source[i]` where unnamed), weights left out:
    what a resume state from another mixture is compared by."""
    out = []
    for i, s in enumerate(spec.sources):
        d = s.to_dict()
        d.pop("weight", None)
        blob = json.dumps(d, sort_keys=True).encode()
        out.append([s.name or f"source[{i}]", hashlib.sha256(blob).hexdigest()[:8]])
    return out
