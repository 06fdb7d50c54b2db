"""The mixture's interleave: exact shares in every window, each component's documents once each
in its own order, the end where the first component runs out, and a rebase under new weights
that continues every component where it was."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from input_client.spec import PipelineSpec, SpecError
from input_server.data.mixture import MixPosition, MixtureOrder, Schedule, quotas
from input_server.data.order import DocumentOrder


def _order(sizes, weights, *, epochs=0, shuffle=True, seed=3) -> MixtureOrder:
    orders = [
        DocumentOrder(
            num_records=n, shard_index=0, shard_count=1, seed=seed + c, shuffle=shuffle,
            epochs=epochs,
        )
        for c, n in enumerate(sizes)
    ]  # fmt: skip
    offsets = np.cumsum([0, *sizes[:-1]]).tolist()
    return MixtureOrder(orders, offsets, MixPosition(quotas(weights)))


def _worst_window(comp: np.ndarray, weights, window: int = 1000) -> float:
    """The largest gap, in documents, between a component's count in any window and its
    weight's share of the window."""
    share = np.asarray(weights, float) / math.fsum(weights)
    worst = 0.0
    for c, s in enumerate(share):
        counts = np.concatenate([[0], np.cumsum(comp == c)])
        got = counts[window:] - counts[:-window]
        worst = max(worst, float(np.abs(got - window * s).max()))
    return worst


@pytest.mark.parametrize(
    "weights, period",
    [
        ((0.3, 0.7), 10),
        ((1, 1, 1), 3),
        ((1 / 3, 2 / 3), 3),
        ((2, 5, 0.5), 15),
        ((math.pi, 1), None),
    ],
)
def test_quotas_are_exact_for_ratios_of_integers(weights, period):
    q = quotas(weights)
    if period is None:  # no small ratio: shares of 2^16
        assert sum(q) == 1 << 16
        assert abs(q[0] / sum(q) - weights[0] / sum(weights)) < 1 / (1 << 16)
    else:
        assert sum(q) == period
        assert [x / period for x in q] == pytest.approx([w / sum(weights) for w in weights])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(min_value=0.01, max_value=100, allow_nan=False), min_size=1, max_size=40))
def test_every_window_of_1000_documents_holds_each_share_within_one_point(weights):
    order = _order([50] * len(weights), weights)
    comp, _ = order.locate(0, 30_000)
    assert _worst_window(comp, weights) <= 10  # 1 percentage point of 1,000 documents


@pytest.mark.parametrize(
    "weights",
    [[0.6] + [0.4 / 39] * 39, [1] * 40, [1, 1, 2, 2, 4, 4, 8, 8], [0.5] + [0.5 / 200] * 200],
    ids=["one-dominant-39-equal", "40-equal", "pairs", "half-and-200-equal"],
)
def test_components_sharing_a_weight_take_turns(weights):
    # Equal quotas once fell on the same places: 39 small components in bursts of 39.
    order = _order([50] * len(weights), weights)
    comp, _ = order.locate(0, 30_000)
    assert _worst_window(comp, weights) <= 2


def test_each_component_reads_its_own_documents_once_each_in_its_order():
    order = _order([7, 30, 101], (0.5, 0.3, 0.2), epochs=0)
    comp, ordinal = order.locate(0, 5000)
    indices = order.source_indices(0, 5000)
    for c, component in enumerate(order.components):
        mine = ordinal[comp == c]
        assert (mine == np.arange(len(mine))).all()  # consecutive: none skipped or repeated
        start = order.offsets[c]
        want = start + component.source_indices(0, len(mine))
        assert (indices[comp == c] == want).all()
    # Each component reshuffles per epoch on its own: every epoch of the 7-document one is a
    # permutation of its records, and two epochs differ.
    first = indices[comp == 0][:14].reshape(2, 7)
    assert sorted(first[0]) == sorted(first[1]) == list(range(7))
    assert (first[0] != first[1]).any()


def test_a_finite_mixture_ends_where_its_first_component_runs_out():
    order = _order([40, 1000, 1000], (0.5, 0.25, 0.25), epochs=2)
    n = len(order)
    comp, ordinal = order.locate(0, n)
    for c, component in enumerate(order.components):
        assert (ordinal[comp == c] < len(component)).all()
    # The first component's 80 documents (2 epochs of 40) are all used, and its next
    # occurrence is the document at `n`.
    assert (comp == 0).sum() == 80
    sched = order.schedule
    assert int(sched.comp[n % sched.period]) == 0
    assert 150 <= n <= 170  # 80 documents at half the mixture


def test_the_order_pickles_and_gives_the_same_documents():
    order = _order([13, 17], (2, 1))
    copy = pickle.loads(pickle.dumps(order))
    assert copy._schedule is None or copy.schedule is not order.schedule
    assert (copy.source_indices(1000, 1500) == order.source_indices(1000, 1500)).all()


@pytest.mark.parametrize("offset", [0, 5])
@pytest.mark.parametrize("at", [0, 1, 997])
def test_a_rebase_under_new_weights_continues_each_component_where_it_was(at, offset):
    old = _order([50, 60, 70], (0.5, 0.3, 0.2))
    nexts = old.next_ordinals(at)
    begun = old.locate(at, at + 1)
    new = old.moved(old.rebased(quotas((0.1, 0.2, 0.7)), at, offset))
    comp, ordinal = new.locate(0, 3000)
    if offset:  # the document begun comes first, to be finished
        assert (comp[0], ordinal[0]) == (begun[0][0], begun[1][0])
    for c in range(3):
        mine = ordinal[comp == c]
        assert (mine == nexts[c] + np.arange(len(mine))).all()
    assert _worst_window(comp, (0.1, 0.2, 0.7)) <= 10


@pytest.mark.parametrize(
    "source, key",
    [
        ([{"paths": ["a"], "weight": 0}, {"paths": ["b"]}], "source[0].weight"),
        ([{"paths": ["a"]}, {"paths": ["b"], "weight": -1}], "source[1].weight"),
        ([{"paths": ["a"], "weight": float("nan")}], "source[0].weight"),
        ([{"paths": ["a"], "weight": float("inf")}], "source[0].weight"),
        ([{"paths": ["a"], "weight": 1e-9}, {"paths": ["b"]}], "source[0].weight"),
        ([], "source"),
        ([{"paths": ["a"], "name": "x"}, {"paths": ["b"], "name": "x"}], "source[1].name"),
        ([{"paths": ["a"], "format": "csv"}], "source[0].format"),
    ],
    ids=["zero", "negative", "nan", "inf", "tiny", "empty", "duplicate-names", "format"],
)
def test_a_bad_mixture_names_the_key(source, key):
    with pytest.raises(SpecError) as e:
        PipelineSpec(source=source, tokenizer={"model": "m.model"})
    assert e.value.key == key


def test_a_schedule_spreads_each_component_evenly():
    sched = Schedule((1, 1000))
    where = sched.positions(0)
    assert len(where) == 1 and 450 <= where[0] <= 550  # the rare one sits mid-period


def test_a_mixtures_order_holds_what_its_components_hold():
    """What caps an "auto" stream's worker processes (`budget.order_bytes`) counts each
    component's permutations, an unshuffled one's none."""
    mix = _order([1_000, 3_000], [1, 1], epochs=1)
    assert mix.held_bytes() == 4 * 4_000 == sum(c.held_bytes() for c in mix.components)
    assert _order([1_000, 3_000], [1, 1], shuffle=False).held_bytes() == 0
