"""One stream fanned in from several real servers (Unix sockets here; across network namespaces
with TLS in tests/system/test_netns.py): the order, exact resume, refusals by name, a server
killed and restarted, arrival order's exactly-once, a pool that changes size."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from collections import Counter

import grpc
import numpy as np
import pytest

from input_client import InputClient, ReconnectError, StreamError
from input_client.fanin import pool_addresses, sub_shard
from input_client.maxtext.source import ServerSource
from input_server.serving.server import Server, ServerConfig
from tests.support import (
    ServerProcess,
    assert_same_batches,
    batch_bytes,
    run_pipeline,
)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Three in-process servers on their own sockets."""
    folder = tmp_path_factory.mktemp("pool")
    servers = [Server(ServerConfig(listen=[f"unix://{folder}/s{j}.sock"])) for j in range(3)]
    yield [s.targets[0] for s in servers]
    for s in servers:
        s.stop(0)


def _round_robin(streams: list[list]) -> list:
    """Batch k from stream k mod N, ended streams skipped: what the fan-in must yield."""
    out, its = [], [iter(s) for s in streams]
    live = list(range(len(its)))
    while live:
        for j in list(live):
            try:
                out.append(next(its[j]))
            except StopIteration:
                live.remove(j)
    return out


def _expected(spec, n: int) -> list:
    return _round_robin([run_pipeline(sub_shard(spec, j, n)) for j in range(n)])


def test_sub_shards_partition_the_hosts_shard_and_nothing_else(make_spec):
    from input_server.data.order import DocumentOrder

    spec = make_spec(shard={"index": 1, "count": 3})
    n_records, n = 1000, 4

    def records(s) -> set[int]:
        o = DocumentOrder(
            num_records=n_records,
            shard_index=s.shard.index,
            shard_count=s.shard.count,
            seed=0,
            shuffle=True,
            epochs=1,
        )
        return set(o.source_indices(0, o.per_epoch).tolist())

    parts = [records(sub_shard(spec, j, n)) for j in range(n)]
    assert set().union(*parts) == records(spec)
    assert sum(map(len, parts)) == len(records(spec))  # disjoint
    assert sub_shard(spec, 0, 1) is spec


def test_round_robin_is_each_sub_streams_batches_in_turn_to_the_end(pool, make_spec):
    spec = make_spec(batch={"seq_len": 64, "size": 3})
    want = _expected(spec, 3)
    with InputClient(pool) as client, client.batches(spec) as it:
        got = list(it)
        assert it.get_state()["fan_in"]["servers"] == 3
    assert len(want) > 12
    assert_same_batches(got, want)


def test_a_fanned_in_state_resumes_exactly_and_is_small_json(pool, make_spec):
    spec = make_spec(batch={"seq_len": 64, "size": 2}, order={"epochs": 0})
    want = list(itertools.islice(iter(_expected_forever(spec, 2)), 30))
    with InputClient(pool[:2]) as client:
        got, state = [], None
        for stop in (7, 8, 19, 30):  # resumed three times, at both servers' turns
            with client.batches(spec, state=state) as it:
                got += [next(it) for _ in range(stop - len(got))]
                state = json.loads(json.dumps(it.get_state()))
        assert state["seq"] == 30
        assert len(json.dumps(state)) < 1000
    assert_same_batches(got, want)


def _expected_forever(spec, n):
    """Round robin over endless sub-streams, lazily."""
    from input_server.batching.parallelism import Parallelism
    from input_server.batching.pipeline import Pipeline

    streams = [
        Pipeline(sub_shard(spec, j, n)).stream(None, parallelism=Parallelism(0, 2))
        for j in range(n)
    ]
    try:
        for k in itertools.count():
            yield next(streams[k % n])
    finally:
        for s in streams:
            s.close()


def _tokens(batches) -> Counter:
    """Every real token of the batches, as a multiset."""
    out = Counter()
    for b in batches:
        b = b.arrays if hasattr(b, "arrays") else b  # the server's own `Produced`, or a client's
        inputs, segments = np.asarray(b["inputs"]), np.asarray(b["inputs_segmentation"])
        out.update(inputs[segments > 0].tolist())
    return out


@pytest.mark.parametrize("servers", [3, 1])
def test_a_fanned_in_state_resumes_on_another_number_of_servers_exactly_once(
    pool, make_spec, servers
):
    spec = make_spec(order={"epochs": 1}, batch={"packing": "concat_then_split"})
    want = _tokens(run_pipeline(spec))  # every document of the epoch, once
    with InputClient(pool[:2]) as two, two.batches(spec) as it:
        before = [next(it) for _ in range(7)]
        state = json.loads(json.dumps(it.get_state()))
    with InputClient(pool[:servers] if servers > 1 else pool[0]) as client:
        with client.batches(spec, state=state) as it:
            after = list(it)
            if servers > 1:
                assert it.get_state()["fan_in"]["servers"] == servers
    assert len(after) > 10
    assert _tokens(before) + _tokens(after) == want


def test_a_named_pipeline_cannot_be_fanned_in(pool):
    with InputClient(pool[:2]) as client, pytest.raises(ValueError, match="needs a PipelineSpec"):
        client.batches("train")


def test_one_address_in_a_list_is_the_plain_stream(pool, make_spec):
    spec = make_spec(order={"epochs": 0})
    with InputClient([pool[0]]) as client, client.batches(spec) as it:
        got = [next(it) for _ in range(5)]
        assert "fan_in" not in it.get_state()
    assert_same_batches(got, run_pipeline(spec, limit=5))


def test_a_failing_sub_stream_names_its_server(tmp_path, pool, corpus, make_spec):
    # Three documents: the fourth server's sub-shard holds none.
    small = tmp_path / "three.jsonl"
    with open(corpus) as f:
        small.write_text("".join(itertools.islice(f, 3)))
    root = tmp_path / "srv"
    root.mkdir()
    spec = make_spec(source={"paths": [str(small)]})
    servers = [
        Server(ServerConfig(listen=[f"unix://{root}/f{j}.sock"], data_roots=["/"]))
        for j in range(4)
    ]
    try:
        with InputClient([s.targets[0] for s in servers]) as client:
            with pytest.raises(StreamError) as e:
                with client.batches(spec) as it:
                    list(it)
    finally:
        for s in servers:
            s.stop(0)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"server 3 of 4 ('unix://{root}/f3.sock')" in e.value.details


def test_arrival_order_is_exactly_once_and_resumes_exactly(pool, make_spec):
    spec = make_spec(batch={"seq_len": 64, "size": 3})
    subs = [run_pipeline(sub_shard(spec, j, 3)) for j in range(3)]
    owner = {batch_bytes(b.arrays): (j, k) for j, s in enumerate(subs) for k, b in enumerate(s)}
    assert len(owner) == sum(map(len, subs))  # every batch tells its sub-stream and place
    taken = []
    with InputClient(pool) as client:
        with client.batches(spec, order="arrival") as it:
            taken += [owner[batch_bytes(next(it))] for _ in range(10)]
            state = it.get_state()
        assert state["fan_in"]["order"] == "arrival"
        with client.batches(spec, state=state, order="arrival") as it:
            taken += [owner[batch_bytes(b)] for b in it]
    # Each sub-stream's batches once each, in its own order.
    for j, s in enumerate(subs):
        assert [k for jj, k in taken if jj == j] == list(range(len(s)))


def test_arrival_order_does_not_wait_for_a_slow_server(tmp_path, make_spec):
    # Server 1's sub-stream stalls (a paused process); arrival keeps taking server 0's.
    spec = make_spec(batch={"seq_len": 64, "size": 2}, order={"epochs": 0})
    # One batch a message (they would share messages up to 262,144 tokens, and the window
    # counts at message boundaries): a stopped server has sent at most its window ahead.
    procs = [
        ServerProcess(
            f"unix://{tmp_path}/a{j}.sock", str(tmp_path / "log"), args=("--message-tokens", "128")
        )
        for j in (0, 1)
    ]
    for p in procs:
        p.start()
    try:
        with InputClient([p.address for p in procs]) as client:
            with client.batches(spec, order="arrival", prefetch=1) as it:
                next(it)
                os.kill(procs[1].child.p.pid, signal.SIGSTOP)
                # Should arrival wait on the stopped server after all, it resumes it after
                # 30 s, and the time below fails the test instead of a hang.
                watchdog = threading.Timer(30, os.kill, (procs[1].child.p.pid, signal.SIGCONT))
                watchdog.start()
                start = time.monotonic()
                for _ in range(300):
                    next(it)
                assert time.monotonic() - start < 30
                watchdog.cancel()
                os.kill(procs[1].child.p.pid, signal.SIGCONT)
                streams = it.get_state()["fan_in"]["streams"]
                # Nearly all from the running server: the stopped one gave only what it had
                # sent before it stopped (its window); round robin would have waited on it.
                assert (streams[1] or {"seq": 0})["seq"] <= 8, streams
    finally:
        for p in procs:
            p.kill()


def test_a_server_killed_and_restarted_loses_and_repeats_nothing(tmp_path, make_spec):
    spec = make_spec(batch={"seq_len": 128, "size": 4}, order={"epochs": 0})
    procs = [ServerProcess(f"unix://{tmp_path}/k{j}.sock", str(tmp_path / "log")) for j in (0, 1)]
    for p in procs:
        p.start()
    got = []
    try:
        with InputClient([p.address for p in procs], connect_timeout_s=60) as client:
            with client.batches(spec, reconnect_deadline_s=60) as it:
                got += [next(it) for _ in range(9)]
                for j, reconnects in ((1, 1), (0, 2)):  # one server, then the other
                    procs[j].kill()  # SIGKILL, its worker processes too
                    procs[j].start()
                    while it.reconnects < reconnects:  # what had arrived comes first
                        got.append(next(it))
                        assert len(got) < 3000, "the kill never broke the stream"
                    got += [next(it) for _ in range(6)]
    finally:
        for p in procs:
            p.kill()
    want = list(itertools.islice(_expected_forever(spec, 2), len(got)))
    assert_same_batches(got, want)


def test_a_server_gone_past_the_deadline_fails_the_stream_naming_it(tmp_path, pool, make_spec):
    spec = make_spec(order={"epochs": 0})
    gone = Server(ServerConfig(listen=[f"unix://{tmp_path}/gone.sock"], grace_s=0.5))
    with InputClient([pool[0], gone.targets[0]]) as client:
        with client.batches(spec, prefetch=1, reconnect_deadline_s=1.0) as it:
            next(it)
            next(it)
            gone.stop()
            with pytest.raises(ReconnectError) as e:
                for _ in range(10_000):
                    next(it)
    assert e.value.address == gone.targets[0]
    assert gone.targets[0] in str(e.value)


def test_maxtexts_checkpoint_carries_the_fanned_in_state(pool, make_spec):
    spec = make_spec(batch={"seq_len": 64, "size": 2}, order={"epochs": 0})
    with InputClient(pool[:2]) as client:

        def source():
            return ServerSource(
                lambda state: client.batches(spec, state=state),
                pad_id=0,
                packing=spec.batch.packing,
            )

        first = iter(source())
        head = [next(first) for _ in range(5)]
        blob = first.get_state()  # what MaxText's checkpoint stores
        first.close()
        second = iter(source())
        second.set_state(blob)
        tail = [next(second) for _ in range(5)]
        second.close()
        whole = iter(source())
        want = [next(whole) for _ in range(10)]
        whole.close()
    assert json.loads(blob)["fan_in"]["servers"] == 2
    assert all(
        sorted(a) == sorted(b) and all((a[k] == b[k]).all() for k in a)
        for a, b in zip(head + tail, want, strict=True)
    )


def test_each_server_sees_its_share_of_the_trainers_pace(pool, make_spec):
    # The trainer takes 20 batches/s; each of two servers' flow control (and an "auto"
    # stream's demand) sees its half.
    spec = make_spec(order={"epochs": 0})
    with InputClient(pool[:2]) as client, client.batches(spec, prefetch=1) as it:
        for _ in range(60):
            next(it)
            time.sleep(0.05)
        streams = [m.info().streams for m in client.members]
    assert [len(s) for s in streams] == [1, 1]
    for (s,) in streams:
        assert abs(s.batches_taken - 30) <= 1, s
        assert 6 < s.consumed_batches_per_s < 12, s


def test_a_new_connect_timeout_reaches_every_server(pool):
    with InputClient(pool[:2], connect_timeout_s=3) as client:
        client.connect_timeout_s = 300  # what the MaxText adapter does for later opens
        assert [m.connect_timeout_s for m in client.members] == [300, 300]


def test_pool_addresses_are_a_statefulsets_stable_names():
    assert pool_addresses("pool", 3, port=50051, namespace="ml") == [
        "pool-0.pool.ml.svc:50051",
        "pool-1.pool.ml.svc:50051",
        "pool-2.pool.ml.svc:50051",
    ]
    assert pool_addresses("p", 1, port=1, service="h", cluster_domain="cluster.local") == [
        "p-0.h.default.svc.cluster.local:1"
    ]
    with pytest.raises(ValueError, match="replicas"):
        pool_addresses("p", 0, port=1)
