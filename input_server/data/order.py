"""Document order: which source record is the stream's n-th document, for whole ranges at once.

Grain's `MapDataset` chain (`[index::count].shuffle(seed).repeat(epochs)`) computes this one
element at a time, at about what tokenizing a document costs (docs/benchmarks.md, "Reading,
order and packing"), so the order alone would halve throughput. This computes the same kind
of order (shard, then a fresh seeded permutation each epoch) for a whole group of documents in
one numpy call.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from input_server.errors import OverBudgetError

FOREVER = int(np.iinfo(np.int64).max)  # computed once: iinfo takes microseconds a call
# A shuffled epoch's permutation holds one uint32 a document of the shard when its values fit
# (fewer than 2**32 documents: every real shard), else one int64. 8 bytes a document refused
# C4-sized corpora on one host that ran before the order was counted.
_UINT32_DOCS = 1 << 32
_MIB = 1 << 20


def bytes_per_document(per_epoch: int) -> int:
    """What a shuffled epoch of `per_epoch` documents holds per document."""
    return 4 if per_epoch < _UINT32_DOCS else 8


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """Epoch `epoch`'s permutation of `range(n)`, seeded by `(seed, epoch)`.

    The same values as `Generator.permutation(n)` (Fisher-Yates draws depend on `n` only, not
    on the array's dtype; `test_order_dtype` compares them), so the order of every stream is
    byte-identical to the int64 one (invariant 1), in half the memory under 2**32 documents.
    """
    # Philox keyed by (seed, epoch): the same order in every process and on every resume.
    rng = np.random.Generator(np.random.Philox(key=[seed, epoch]))
    perm = np.arange(n, dtype=np.uint32 if n < _UINT32_DOCS else np.int64)
    rng.shuffle(perm)  # in place: `permutation(n)` would build an int64 arange first
    return perm


@dataclasses.dataclass(frozen=True, kw_only=True)
class OrderBudget:
    """What a stream's document orders may hold, checked before any is computed.

    Attributes:
      max_bytes: the most all copies of the order may hold together (what the server's
        --stream-memory-mb leaves after the stream's batches and groups).
      copies: the processes that each compute the order (the server's, and each worker's).
      flag_mb: the server's --stream-memory-mb, for the message.
    """

    max_bytes: int
    copies: int = 1
    flag_mb: float = 0.0

    def check(self, orders: list[DocumentOrder], where: str) -> None:
        """Refuses (RESOURCE_EXHAUSTED) orders that would hold more than `max_bytes`."""
        each = sum(o.held_bytes() for o in orders)
        need = each * self.copies
        if need <= self.max_bytes:
            return
        docs = sum(o.per_epoch for o in orders)
        sizes = sorted({bytes_per_document(o.per_epoch) for o in orders if o.shuffle})
        raise OverBudgetError(
            f"the stream's document order would hold {need / _MIB:,.0f} MiB ({docs:,} "
            f"documents a shuffled epoch{where}, {' or '.join(map(str, sizes))} bytes each, "
            f"up to two "
            f"epochs at once, in each of {self.copies} processes), over the "
            f"{max(0, self.max_bytes) / _MIB:,.0f} MiB the server's --stream-memory-mb "
            f"{self.flag_mb:g} leaves it; name each file once, use more shards "
            f"(`shard.count`) or fewer worker processes, or ask the operator for a larger "
            f"budget."
        )


@dataclasses.dataclass(frozen=True)
class MixPosition:
    """Where a mixture's interleave starts (`origin`, a schedule position) and each
    component's documents before it (`bases`), under integer `quotas`. A fresh stream:
    origin 0, bases 0. (Here, not in `mixture.py`: it is what `Order.at` holds.)"""

    quotas: tuple[int, ...]
    origin: int = 0
    bases: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return {"quotas": list(self.quotas), "origin": self.origin, "bases": list(self.bases)}


class Order(Protocol):
    """What a stream reads, whichever kind of order: a shard's (`DocumentOrder`), a mixture's
    (`mixture.MixtureOrder`), a resharded state's (`elastic.ReshardedOrder`). Each subclasses
    it, so whoever holds an order asks it, never which class it is (issue 52;
    `tests/unit/test_order_protocol.py` refuses an `isinstance` on them). The defaults are a
    one-source order's; a mixture overrides them with its components'.
    """

    per_epoch: int  # documents of one pass (a mixture's: over every component)
    # Where its interleave stands, which its resume state carries beside the ordinal: a
    # mixture's; None for one source (the ordinal alone is its position).
    at: MixPosition | None = None
    # It continues old streams' documents (a resharded state's, or a mixture of those): its
    # epochs are not a shard's arithmetic, so each is asked of it (`epoch_of`, `epoch_range`).
    resharded: bool = False

    @abc.abstractmethod
    def __len__(self) -> int:
        """Documents in the stream; FOREVER when it repeats forever."""

    @abc.abstractmethod
    def held_bytes(self) -> int:
        """The most its permutations hold at once (`OrderBudget` counts it)."""

    @abc.abstractmethod
    def source_indices(self, start: int, stop: int) -> np.ndarray:
        """Source record indices of stream documents `[start, stop)`: what positions read."""

    @property
    def components(self) -> Sequence[Order]:
        """Its one-source orders: itself, or a mixture's each."""
        return [self]

    def with_components(self, parts: Sequence[Order]) -> Order:
        """The same kind of order over `parts`, one a component (a mixture's interleave at
        its start): how a resharded state's orders are put together."""
        (part,) = parts
        return part

    def moved(self, at: MixPosition | None) -> Order:
        """The same order with its interleave at `at` (one source has none: itself)."""
        return self

    def component_positions(self, doc: int, offset: int) -> list[tuple[int, int]]:
        """Each component's next document and the tokens of it used, when stream document
        `doc` is next with `offset` of its tokens used."""
        return [(doc, offset)]

    def used_heads(self) -> dict[int, int]:
        """Its documents whose first tokens an earlier stream used (ordinal -> tokens)."""
        return {}

    def settled_at(self, doc: int) -> tuple[int, MixPosition | None] | None:
        """Where stream document `doc` stands in the order of its own shard, once every
        component is past the old streams' documents it was dealt: (doc, interleave); None
        before. A shard's order is its own: `doc` as it is."""
        return doc, None


class LockedCache:
    """An order's epoch cache and the lock that guards it (a worker process's threads share one
    order): a copy (a pickle for a worker process) starts with an empty cache and its own lock."""

    def __getstate__(self):
        state = {**self.__dict__, "_cache": {}}
        del state["_lock"]  # a lock does not pickle; each copy makes its own
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


class DocumentOrder(LockedCache, Order):
    """Maps stream ordinals to source indices: shard `index::count`, shuffled per epoch.

    Picklable and cheap to send: the permutation of an epoch is computed lazily in each process
    (4 bytes per document of the shard, 8 from 2**32 documents) and the last two epochs are
    kept, since a group of documents can straddle an epoch boundary.

    Args:
      num_records: records in the whole source.
      shard_index, shard_count: this stream reads records `shard_index + k * shard_count`.
      seed: permutation seed; each epoch's permutation is seeded by `(seed, epoch)`.
      shuffle: if False, every epoch reads the shard in source order.
      epochs: passes over the shard; 0 repeats forever.
    """

    def __init__(
        self,
        *,
        num_records: int,
        shard_index: int,
        shard_count: int,
        seed: int,
        shuffle: bool,
        epochs: int,
    ):
        self.shard_index = shard_index
        self.shard_count = shard_count
        self.per_epoch = len(range(shard_index, num_records, shard_count))
        self.seed = seed
        self.shuffle = shuffle
        self.epochs = epochs
        self._cache: dict[int, np.ndarray] = {}
        # A worker process's threads share one order: the cache's check, eviction and insert
        # are one step under this lock (unguarded, two threads evicted the same epoch: KeyError).
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Documents in the stream; a very large number when it repeats forever."""
        return self.per_epoch * self.epochs if self.epochs else FOREVER

    # The last epoch an earlier stream had begun for this one (a `ReshardedOrder`'s own): none.
    last = -1

    def epoch_range(self, e: int) -> tuple[int, int]:
        """The ordinals `[lo, hi)` of its documents of epoch `e`."""
        n = len(self)
        return min(e * self.per_epoch, n), min((e + 1) * self.per_epoch, n)

    def epoch_of(self, x: int) -> int:
        """The epoch of its document `x`."""
        return x // self.per_epoch

    def held_bytes(self) -> int:
        """The most its permutations hold at once: none unshuffled, one epoch's when it reads
        one epoch, else two (`OrderBudget` counts it before any is computed)."""
        if not self.shuffle:
            return 0
        per_doc = bytes_per_document(self.per_epoch)
        return per_doc * self.per_epoch * (1 if self.epochs == 1 else 2)

    def _permutation(self, epoch: int) -> np.ndarray:
        with self._lock:  # held while computing too: a thread that needs it would wait anyway
            perm = self._cache.get(epoch)
            if perm is None:
                # The oldest goes before the next is computed: at most two held at once.
                if len(self._cache) >= 2:
                    del self._cache[min(self._cache)]
                perm = permutation(self.seed, epoch, self.per_epoch)
                self._cache[epoch] = perm
            return perm

    def source_indices(self, start: int, stop: int) -> np.ndarray:
        """Source record indices of stream documents `[start, stop)`."""
        stop = min(stop, len(self))
        if start < stop and start // self.per_epoch == (stop - 1) // self.per_epoch:
            # One epoch (most groups): a slice of its permutation, no index arrays.
            epoch, first = divmod(start, self.per_epoch)
            # int64 before the arithmetic: a uint32 slice times a Python int stays uint32
            # under NumPy 2 (wrapping past 2**32 source records, or refusing a shard count
            # past it), and callers get the same int64 indices as ever.
            within = (
                self._permutation(epoch)[first : first + stop - start].astype(np.int64)
                if self.shuffle
                else np.arange(first, first + stop - start, dtype=np.int64)
            )
            return self.shard_index + self.shard_count * within
        return self.indices_of(np.arange(start, stop, dtype=np.int64))

    def indices_of(self, ordinals: np.ndarray) -> np.ndarray:
        """Source record indices of the stream documents `ordinals` (each below `len`)."""
        epochs, within = np.divmod(ordinals, self.per_epoch)
        if self.shuffle and len(epochs) and epochs.min() == epochs.max():  # one epoch: most groups
            shuffled = self._permutation(int(epochs[0]))[within].astype(np.int64)
            return self.shard_index + self.shard_count * shuffled
        if self.shuffle:
            shuffled = np.empty(len(within), np.int64)  # not uint32: see `source_indices`
            for epoch in np.unique(epochs):
                mask = epochs == epoch
                shuffled[mask] = self._permutation(int(epoch))[within[mask]]
            within = shuffled
        return self.shard_index + self.shard_count * within
