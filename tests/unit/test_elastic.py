"""Elastic resume: a run's states resharded onto another host count deliver every token of
every begun epoch exactly once, over the old hosts before and the new hosts after, with every
packing and long-document policy, mixtures, and hosts that drifted apart."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from input_client.elastic import reshard
from input_server.data.mixture import order_for
from tests.elastic_support import Ledger, Stream, components_at, spec_of, token

PACKINGS = ["first_fit", "concat_then_split", "none"]
POLICIES = ["trim", "chunk", "split"]


def kept(length: int, packing: str, policy: str, seq_len: int) -> int:
    """The tokens of a document of `length` that a stream delivers."""
    whole = policy == "chunk" or (policy == "split" and packing == "concat_then_split")
    return length if whole else min(length, seq_len)


def check_exactly_once(lengths, c, new_count, progress, packing, policy, seq_len, size, shuffle):
    def spec(i, count):
        return spec_of(
            lengths,
            shard=(i, count),
            packing=packing,
            long_documents=policy,
            seq_len=seq_len,
            size=size,
            epochs=0,
            shuffle=shuffle,
        )

    delivered = Counter()
    states, ledger = [], Ledger([len(x) for x in lengths], c)
    for i in range(c):
        s = Stream(spec(i, c), lengths)
        while s.position().doc < progress[i]:  # up to `progress[i]` documents of its stream
            delivered.update(s.next().tolist())
        states.append(s.state)
        ledger.old(*components_at(s.order, s.position()))
    resumed = reshard(states, new_count)
    for j in range(new_count):
        s = Stream(spec(j, new_count), lengths, resumed[j])
        dealt = ledger.dealt(j, new_count)
        while True:  # until it has read every document dealt to it
            at = components_at(s.order, s.position())
            if all(n >= d for n, d in zip(at[0], dealt, strict=True)):
                break
            delivered.update(s.next().tolist())
        ledger.new(order_for(spec(j, new_count), s.records), j, new_count, *at)
    want = Counter()
    for (k, r), times in ledger.whole().items():
        for t in range(kept(lengths[k][r], packing, policy, seq_len)):
            want[token(k, r, t)] = times
    for k, r, used in ledger.partial:
        for t in range(min(used, kept(lengths[k][r], packing, policy, seq_len))):
            want[token(k, r, t)] += 1
    wrong = {
        t: (delivered[t], want[t]) for t in set(delivered) | set(want) if delivered[t] != want[t]
    }
    assert not wrong, f"tokens read other than the rule says: {dict(list(wrong.items())[:8])}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    components=st.integers(1, 3),
    c=st.integers(1, 16),
    new_count=st.integers(1, 16),
    packing=st.sampled_from(PACKINGS),
    policy=st.sampled_from(POLICIES),
    seq_len=st.sampled_from([8, 16]),
    size=st.integers(1, 3),
    shuffle=st.booleans(),
)
def test_every_token_of_every_begun_epoch_once(
    data, components, c, new_count, packing, policy, seq_len, size, shuffle
):
    if policy == "split" and packing != "concat_then_split":
        policy = "trim"  # split runs a document on from row to row: concat_then_split only
    # Empty documents only where they take a row (none packing keeps them, unless chunked
    # into no pieces): a forever stream of a shard holding only empty ones places nothing.
    least = 0 if packing == "none" and policy != "chunk" else 1
    lengths = [
        data.draw(st.lists(st.integers(least, 40), min_size=16, max_size=40), label=f"lengths[{k}]")
        for k in range(components)
    ]
    # Each old host's documents read (some past an epoch's end, others not begun: drift).
    per_shard = sum(-(-len(x) // c) for x in lengths)
    most = 3 * per_shard
    progress = data.draw(st.lists(st.integers(0, most), min_size=c, max_size=c), label="progress")
    check_exactly_once(lengths, c, new_count, progress, packing, policy, seq_len, size, shuffle)
