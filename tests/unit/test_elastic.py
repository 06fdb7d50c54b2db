"""Elastic resume: a run's states resharded onto another host count deliver every token of
every begun epoch exactly once, over the old hosts before and the new hosts after, with every
packing and long-document policy, mixtures, and hosts that drifted apart."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from input_client.elastic import reshard, reshard_servers
from input_server.data.mixture import order_for
from tests.support.elastic import Ledger, Stream, components_at, spec_of, token

PACKINGS = ["first_fit", "concat_then_split", "none"]
POLICIES = ["trim", "chunk", "split"]


def valid_policy(packing: str, policy: str) -> str:
    """`policy`, or trim where it is split and the packing cannot run a document on from row
    to row (only concat_then_split can)."""
    return "trim" if policy == "split" and packing != "concat_then_split" else policy


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
    policy = valid_policy(packing, policy)
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


def _states(c: int, *, seed: int = 7, take: int = 2) -> list:
    """The states of `c` hosts of one small run, each after `take` batches."""
    lengths = [[5 + (r * 7) % 30 for r in range(40)]]
    out = []
    for i in range(c):
        spec = spec_of(
            lengths,
            shard=(i, c),
            packing="concat_then_split",
            long_documents="split",
            seq_len=8,
            size=2,
            epochs=0,
        ).replace(order={"seed": seed, "epochs": 0})
        s = Stream(spec, lengths)
        for _ in range(take):
            s.next()
        out.append(s.state)
    return out


def _without(key: str, states: list) -> list:
    return [{k: v for k, v in s.items() if k != key} for s in states]


REFUSED = {
    "a host missing": (lambda: _states(3)[:2], "shard 0 of 3, but the states given make 2"),
    "a host twice": (
        lambda: [_states(3)[0], _states(3)[0], _states(3)[2]],
        "shard 0's state, in shard 1's place",
    ),
    "out of order": (lambda: _states(3)[::-1], "shard 2's state, in shard 0's place"),
    "another seed": (
        lambda: _states(3)[:2] + [_states(3, seed=8)[2]],
        "different specs or seeds",
    ),
    "a forged count": (
        lambda: [{**s, "shard": [i, 5]} for i, s in enumerate(_states(2))],
        "of 5, but the states given make 2",
    ),
    "an older server's": (lambda: _without("run", _states(2)), "before elastic resume"),
    "none": (lambda: [], "`states` is empty"),
    "not a state": (lambda: ["nope", None], r"`states\[0\]` is a str"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_states_that_cannot_be_combined_are_refused_by_name(case):
    states, message = REFUSED[case]
    with pytest.raises(ValueError, match=message):
        reshard(states(), 2)
    with pytest.raises(ValueError, match="`count` must be a positive integer"):
        reshard(_states(2), 0)


def test_no_host_began_is_a_fresh_run_and_the_same_count_reshards_exactly():
    assert reshard([None, None], 3) == [None, None, None]
    states = _states(2)
    again = reshard(states, 2)
    assert [s["shard"] for s in again] == [[0, 2], [1, 2]]
    assert len(json.dumps(again[0])) < 2 * len(json.dumps(states)) + 400  # old states, held once
    many = _states(16)  # docs/architecture.md: about 130 bytes an old host, one source
    assert len(json.dumps(reshard(many, 3)[0])) < 130 * 16 + 200


def _host(spec, lengths, state, servers: int) -> list[Stream]:
    """Host `spec.shard`'s streams from its state: one, or one a server (sub-shards)."""
    if servers == 1:
        return [Stream(spec, lengths, state)]
    i, c = spec.shard.index, spec.shard.count
    subs = state["fan_in"]["streams"] if state else [None] * servers
    return [
        Stream(spec.replace(shard={"index": i + c * k, "count": c * servers}), lengths, sub)
        for k, sub in enumerate(subs)
    ]


def _changed(states: list, before: tuple[int, int], count: int, servers: int) -> list:
    """The states after a change from `before` (hosts, servers a host) to `count`, `servers`."""
    states = reshard(states, count) if count != before[0] else states
    if servers != before[1]:
        states = [reshard_servers(s, servers) if s else None for s in states]
    return states


def _fanned(streams: list[Stream]) -> dict:
    subs = [s.state for s in streams]
    fan = {"servers": len(streams), "order": "round_robin", "next": 0, "ended": [], "streams": subs}
    return {"seq": sum(s.seq for s in streams), "fan_in": fan}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    chain=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 3)), min_size=2, max_size=4),
    packing=st.sampled_from(PACKINGS),
    policy=st.sampled_from(POLICIES),
    epochs=st.integers(1, 2),
)
def test_resharded_again_and_fanned_in_every_token_once_an_epoch(
    data, chain, packing, policy, epochs
):
    """Changes of host count and of servers a host (`reshard`, `reshard_servers`), one after
    another before the documents of the last ran out; the last hosts read to the end."""
    policy = valid_policy(packing, policy)
    lengths = [data.draw(st.lists(st.integers(1, 30), min_size=36, max_size=48), label="lengths")]
    delivered, states = Counter(), None
    for step, (count, servers) in enumerate(chain):
        if step:
            try:
                states = _changed(states, chain[step - 1], count, servers)
            except ValueError as e:  # the documented bound on nesting, tested on its own
                assume("old streams in all" not in str(e))
                raise
        last, now = step == len(chain) - 1, []
        for i in range(count):
            spec = spec_of(
                lengths, shard=(i, count), packing=packing, long_documents=policy,
                seq_len=8, size=2, epochs=epochs,
            )  # fmt: skip
            streams = _host(spec, lengths, states[i] if states else None, servers)
            for s in streams:
                take = 10**9 if last else data.draw(st.integers(0, 12), label="batches")
                while take and (tokens := s.next()) is not None:
                    delivered.update(tokens.tolist())
                    take -= 1
            now.append(streams[0].state if servers == 1 else _fanned(streams))
        states = now
    want = Counter()
    for r, length in enumerate(lengths[0]):
        for t in range(kept(length, packing, policy, 8)):
            want[token(0, r, t)] = epochs
    wrong = {t: (delivered[t], want[t]) for t in delivered | want if delivered[t] != want[t]}
    assert not wrong, f"tokens read other than once an epoch: {dict(list(wrong.items())[:8])}"


def test_old_hosts_far_apart_are_refused_before_any_order_is_built():
    from input_server.errors import InvalidSpecError

    lengths = [[5] * 40]
    new = reshard(_states(2), 1)[0]
    new["elastic"]["from"][1]["doc"] = 40 * 70  # 70 epochs of its 20 documents ahead
    spec = spec_of(
        lengths, shard=(0, 1), packing="concat_then_split", long_documents="split",
        seq_len=8, size=2, epochs=0,
    ).replace(order={"seed": 7, "epochs": 0})  # fmt: skip
    with pytest.raises(InvalidSpecError, match="stand 1[0-9]{2} epochs apart"):
        Stream(spec, lengths, new)
    for entry in new["elastic"]["from"]:  # together, but where ordinals would wrap int64
        entry["doc"] = 1 << 61
    with pytest.raises(InvalidSpecError, match="ordinals would pass"):
        Stream(spec, lengths, new)


def test_states_resharded_again_and_again_before_settling_are_refused_by_the_client():
    one = _states(1)[0]  # the client checks their shape only: one host's, as 64 hosts'
    states = [{**one, "shard": [i, 64]} for i in range(64)]
    states = reshard(states, 65)  # each new state holds all 64
    with pytest.raises(ValueError, match="name 4,225 old streams in all"):
        reshard(states, 2)  # 65 states, each holding 64 more
    with pytest.raises(ValueError, match="4097 new streams"):
        reshard(_states(2), 4097)


def test_the_worked_example_of_the_docs():
    """docs/architecture.md, "Elastic resume": 24 records, 4 hosts -> 3, unshuffled."""
    import pickle

    from input_server.data.elastic import Old, ReshardedOrder
    from input_server.data.order import DocumentOrder

    def shard(i, c):
        return DocumentOrder(
            num_records=24, shard_index=i, shard_count=c, seed=1, shuffle=False, epochs=0
        )

    olds = [Old(shard(i, 4), n, h) for i, (n, h) in enumerate([(3, 5), (4, 0), (2, 0), (6, 0)])]
    want = [[12, 17, 14, 0, 3, 6], [16, 21, 18, 1, 4, 7], [20, 10, 22, 2, 5, 8]]
    for j in range(3):
        order = ReshardedOrder(olds, (j, 3), shard(j, 3))
        assert order.source_indices(0, 6).tolist() == want[j]
        assert order.heads == ({0: 5} if j == 0 else {})  # record 12 from its token 5
        again = pickle.loads(pickle.dumps(order))  # as a worker process gets it
        assert again.source_indices(0, 6).tolist() == want[j]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    components=st.integers(1, 3),
    c=st.integers(1, 6),
    new_count=st.integers(1, 6),
    packing=st.sampled_from(PACKINGS),
    policy=st.sampled_from(POLICIES),
)
def test_a_resharded_stream_resumed_from_any_of_its_states_continues_byte_for_byte(
    data, components, c, new_count, packing, policy
):
    """Before and after it has read what it was dealt (its states then plain, holding no old
    state), every state of a resharded stream resumes to the same batches."""
    policy = valid_policy(packing, policy)
    lengths = [[1 + (r * 11 + k) % 37 for r in range(20 + 3 * k)] for k in range(components)]

    def spec(i, count):
        return spec_of(
            lengths, shard=(i, count), packing=packing, long_documents=policy,
            seq_len=8, size=2, epochs=0,
        )  # fmt: skip

    states = []
    for i in range(c):
        s = Stream(spec(i, c), lengths)
        for _ in range(data.draw(st.integers(0, 8), label="old batches")):
            s.next()
        states.append(s.state)
    j = data.draw(st.integers(0, new_count - 1), label="new host")
    s = Stream(spec(j, new_count), lengths, reshard(states, new_count)[j])
    batches, after = [], [s.state]
    while len(batches) < 400 and "elastic" in (after[-1] or {}):
        batches.append(s.next())
        after.append(s.state)
    assert "elastic" not in (after[-1] or {}), "400 batches past a few old ones: not settled"
    for _ in range(8):  # and some plain states after
        batches.append(s.next())
        after.append(s.state)
    k = data.draw(st.integers(0, len(batches) - 1), label="resumed after")
    again = Stream(spec(j, new_count), lengths, after[k])
    for want in batches[k:]:
        assert again.next().tolist() == want.tolist()


def test_a_resharded_streams_order_counts_the_old_hosts_permutations():
    """What caps an "auto" stream's worker processes (`budget.order_bytes`) counts the
    order a resharded state makes, not the spec's own shard's alone."""
    from types import SimpleNamespace

    from input_server.batching.budget import order_bytes

    lengths = [[5 + (r * 7) % 30 for r in range(40)]]
    spec = spec_of(
        lengths, shard=(0, 1), packing="concat_then_split", long_documents="split",
        seq_len=8, size=2, epochs=0,
    )  # fmt: skip
    s = Stream(spec, lengths, reshard(_states(2), 1)[0])
    plain = SimpleNamespace(order=order_for(spec, s.records))
    assert order_bytes(plain, s.pos) == s.pos.order.held_bytes() > order_bytes(plain)
