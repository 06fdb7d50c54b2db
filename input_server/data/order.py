"""Document order: which source record is the stream's n-th document, for whole ranges at once.

Grain's `MapDataset` chain (`[index::count].shuffle(seed).repeat(epochs)`) computes this one
element at a time, at about what tokenizing a document costs (docs/benchmarks.md, "Reading,
order and packing"), so the order alone would halve throughput. This computes the same kind
of order (shard, then a fresh seeded permutation each epoch) for a whole group of documents in
one numpy call.
"""

from __future__ import annotations

import numpy as np

_FOREVER = int(np.iinfo(np.int64).max)  # computed once: iinfo takes microseconds a call


class DocumentOrder:
    """Maps stream ordinals to source indices: shard `index::count`, shuffled per epoch.

    Picklable and cheap to send: the permutation of an epoch is computed lazily in each process
    (8 bytes per document of the shard) and the last two epochs are kept, since a group of
    documents can straddle an epoch boundary.

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

    def __getstate__(self):
        return {**self.__dict__, "_cache": {}}

    def __len__(self) -> int:
        """Documents in the stream; a very large number when it repeats forever."""
        return self.per_epoch * self.epochs if self.epochs else _FOREVER

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._cache.get(epoch)
        if perm is None:
            # Philox keyed by (seed, epoch): the same order in every process and on every resume.
            rng = np.random.Generator(np.random.Philox(key=[self.seed, epoch]))
            perm = rng.permutation(self.per_epoch)
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = perm
        return perm

    def source_indices(self, start: int, stop: int) -> np.ndarray:
        """Source record indices of stream documents `[start, stop)`."""
        stop = min(stop, len(self))
        if start < stop and start // self.per_epoch == (stop - 1) // self.per_epoch:
            # One epoch (most groups): a slice of its permutation, no index arrays.
            epoch, first = divmod(start, self.per_epoch)
            within = (
                self._permutation(epoch)[first : first + stop - start]
                if self.shuffle
                else np.arange(first, first + stop - start, dtype=np.int64)
            )
            return self.shard_index + self.shard_count * within
        return self.indices_of(np.arange(start, stop, dtype=np.int64))

    def indices_of(self, ordinals: np.ndarray) -> np.ndarray:
        """Source record indices of the stream documents `ordinals` (each below `len`)."""
        epochs, within = np.divmod(ordinals, self.per_epoch)
        if self.shuffle and len(epochs) and epochs.min() == epochs.max():  # one epoch: most groups
            return self.shard_index + self.shard_count * self._permutation(int(epochs[0]))[within]
        if self.shuffle:
            shuffled = np.empty_like(within)
            for epoch in np.unique(epochs):
                mask = epochs == epoch
                shuffled[mask] = self._permutation(int(epoch))[within[mask]]
            within = shuffled
        return self.shard_index + self.shard_count * within
