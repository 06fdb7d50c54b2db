"""What a resharded state is checked against before its orders are built: its deal against the
spec's shard (by the server's own parser, through `tests.support.elastic.Stream`), and the
shortcut its old states' fingerprints take (equal to `data_fingerprint` on every shard)."""

from __future__ import annotations

import json

import pytest

from input_client.elastic import reshard, reshard_servers
from input_client.spec import ShardSpec
from input_server.batching.resharded import ShardFingerprints
from input_server.errors import InvalidSpecError
from tests.support.elastic import Stream, spec_of

LENGTHS = [[5 + (r * 7) % 30 for r in range(40)]]


def _spec(shard, lengths=LENGTHS):
    return spec_of(
        lengths,
        shard=shard,
        packing="concat_then_split",
        long_documents="split",
        seq_len=8,
        size=2,
        epochs=0,
    )


def _states(c: int) -> list:
    out = []
    for i in range(c):
        s = Stream(_spec((i, c)), LENGTHS)
        for _ in range(2 + i):
            s.next()
        out.append(s.state)
    return out


@pytest.mark.parametrize(
    "shard, deal, said",
    [
        ((1, 3), [0, 3], "`resume_state.elastic.deal` is [0, 3], but this spec's `shard` [1, 3]"),
        ((1, 3), [1, 2], "takes share [1, 3]"),
        ((1, 3), [1, 4096], "`resume_state.elastic.deal` is [1, 4096]"),
    ],
    ids=["another share", "another count", "a count past the new hosts"],
)
def test_a_deal_that_does_not_match_the_spec_shard_is_refused_by_name(shard, deal, said):
    state = json.loads(json.dumps(reshard(_states(2), 3)[shard[0]]))
    state["elastic"]["deal"] = deal
    with pytest.raises(InvalidSpecError) as e:
        Stream(_spec(shard), LENGTHS, state)
    assert said in str(e.value)


def test_a_spec_shard_outside_the_old_streams_shard_is_refused():
    """One host's servers' sub-shards (shard 1 of 2 on 2 servers: 1 and 3 of 4) resharded onto
    3 servers: a spec of sub-shard 0 of 6 is not part of host shard 1 of 2."""
    subs = []
    for k in range(2):
        s = Stream(_spec((1 + 2 * k, 4)), LENGTHS)
        s.next()
        subs.append(s.state)
    state = reshard_servers({"seq": 1, "fan_in": {"servers": 2, "streams": subs}}, 3)
    first = state["fan_in"]["streams"][0]
    assert first["shard"] == [1, 6] and first["elastic"]["deal"] == [0, 3]
    Stream(_spec((1, 6)), LENGTHS, first)  # as written: read
    forged = json.loads(json.dumps(first))
    forged["shard"] = [0, 6]
    with pytest.raises(InvalidSpecError) as e:
        Stream(_spec((0, 6)), LENGTHS, forged)
    assert "old streams held shard [1, 2]" in str(e.value)


def test_honest_deals_are_read():
    for count in (1, 3, 5):
        for j, state in enumerate(reshard(_states(4), count)):
            Stream(_spec((j, count)), LENGTHS, state).next()


@pytest.mark.parametrize("components", [1, 3])
def test_shard_fingerprints_are_data_fingerprint_on_every_shard(components):
    spec = _spec((0, 1), [LENGTHS[0]] * components)
    fingerprints = ShardFingerprints(spec)
    for shard in [
        ShardSpec(),
        ShardSpec(index=7, count=4096),
        ShardSpec(index=2**31 - 2, count=2**31 - 1),
    ]:
        assert fingerprints(shard) == spec.data_fingerprint(weights=not spec.all_named, shard=shard)
