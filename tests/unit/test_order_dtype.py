"""A shuffled epoch's permutation held as uint32 under 2**32 documents: the same values as the
int64 `Generator.permutation` it replaced (so every stream's document order, and every batch,
is byte-identical: invariant 1), int64 source indices out, and 4 bytes a document counted
against the stream's budget (8 from 2**32 documents). 8 bytes a document refused a C4-sized
corpus on one host (~88 M documents a shard with two workers at the default 2048 MB)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from input_server.data.order import DocumentOrder, OrderBudget, bytes_per_document, permutation
from input_server.errors import OverBudgetError


def _int64_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order as it was computed before: `Generator.permutation(n)`, int64."""
    return np.random.Generator(np.random.Philox(key=[seed, epoch])).permutation(n)


def _order(n: int, *, index=0, count=1, seed=7, epochs=0, shuffle=True) -> DocumentOrder:
    return DocumentOrder(
        num_records=n, shard_index=index, shard_count=count, seed=seed, shuffle=shuffle,
        epochs=epochs,
    )  # fmt: skip


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 65_537, 1 << 20, 3_000_017])
@pytest.mark.parametrize("seed", [0, 1, 12_345, 2**63 - 1])
def test_the_uint32_permutation_has_the_int64_one_s_values(n, seed):
    for epoch in (0, 1, 9):
        got = permutation(seed, epoch, n)
        assert got.dtype == np.uint32 and got.nbytes == 4 * n
        np.testing.assert_array_equal(got, _int64_permutation(seed, epoch, n))


def test_source_indices_are_the_int64_path_s_over_epochs_shards_and_straddles():
    """Every consumer's view: the same int64 indices as from the int64 permutation, within an
    epoch, across an epoch boundary (the multi-epoch path) and through a pickled copy."""
    n, count, index, seed = 10_007, 3, 2, 99
    order = _order(n, index=index, count=count, seed=seed, epochs=3)
    per = order.per_epoch
    expected = np.concatenate([index + count * _int64_permutation(seed, e, per) for e in range(3)])
    for start, stop in [(0, 950), (per - 400, per + 550), (2 * per + 5, 3 * per), (0, 3 * per)]:
        got = order.source_indices(start, stop)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected[start:stop])
    copy = pickle.loads(pickle.dumps(order))
    np.testing.assert_array_equal(
        copy.source_indices(per - 3, per + 3), expected[per - 3 : per + 3]
    )


def test_indices_past_2_32_source_records_do_not_wrap():
    """A uint32 slice times a Python int stays uint32 under NumPy 2: a shard of a source past
    2**32 records (few documents a shard, a huge shard count) must not wrap or raise."""
    count = 1 << 33
    order = _order(5 * count, index=11, count=count, seed=3)
    assert order.per_epoch == 5
    expected = 11 + count * _int64_permutation(3, 0, 5)
    np.testing.assert_array_equal(order.source_indices(0, 5), expected)
    np.testing.assert_array_equal(
        order.source_indices(3, 8)[2:], 11 + count * _int64_permutation(3, 1, 5)[:3]
    )


def test_the_budget_counts_4_bytes_a_document_under_2_32_and_8_from_it():
    assert _order(1_000_000, epochs=1).held_bytes() == 4_000_000
    assert _order(1_000_000, epochs=0).held_bytes() == 8_000_000  # two epochs at once
    assert _order(1_000_000, shuffle=False).held_bytes() == 0
    # Counted, never computed: a shard of 2**32 documents needs int64 values.
    assert bytes_per_document((1 << 32) - 1) == 4 and bytes_per_document(1 << 32) == 8
    assert _order(1 << 32, epochs=1).held_bytes() == 8 << 32
    # 10 M documents over two epochs in 3 processes: 229 MiB, refused by 200 MiB with the
    # size a document it was counted at; 240 MB of it would have been 458 MiB at 8 bytes.
    budget = OrderBudget(max_bytes=240 << 20, copies=3, flag_mb=256)
    budget.check([_order(10_000_000)], "")
    with pytest.raises(OverBudgetError, match=r"229 MiB \(10,000,000 documents.*4 bytes each"):
        OrderBudget(max_bytes=200 << 20, copies=3, flag_mb=256).check([_order(10_000_000)], "")
