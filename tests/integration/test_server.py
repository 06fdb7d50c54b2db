"""The real server in process, over a Unix socket and TCP: data over the wire, resume, statuses,
limits, coalescing into messages, teardown."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from input_client import InputClient, StreamError
from input_server.batching.parallelism import Parallelism
from input_server.serving.server import Server, ServerConfig
from tests.support import (
    TOKENS,
    assert_same_batches,
    dial,
    health,
    raw_messages,
    run_pipeline,
    still_running,
    worker_processes,
)


def test_resume_with_different_worker_count_over_the_wire(client, make_spec):
    spec = make_spec()
    with client.batches(spec) as it:
        head = [next(it) for _ in range(3)]
        state = it.get_state()
    with client.batches(make_spec(workers={"count": 1}), state=state) as it:
        tail = list(it)
    assert_same_batches(head + tail, run_pipeline(spec))


def test_named_pipeline_streams_and_info_describes_it(tmp_path, make_spec):
    spec = make_spec(order={"epochs": 0})  # endless, so the stream is still open for info
    with (
        Server(
            ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], pipelines={"small": spec})
        ) as srv,
        InputClient(srv.targets[0]) as client,
    ):
        with client.batches("small") as it:
            # The first epoch of an endless stream is the one-epoch stream.
            assert_same_batches([next(it), next(it)], run_pipeline(make_spec(), limit=2))
            info = client.info()
        assert info.server_version
        assert list(info.pipelines) == ["small"]
        assert info.pipelines["small"].batch.seq_len == spec.batch.seq_len
        (stream,) = info.streams
        assert stream.pipeline == "small"
        assert stream.worker_processes == 0 and stream.worker_threads >= 1
        assert stream.batches_sent >= 2
        with pytest.raises(StreamError) as e:
            next(client.batches("nope"))
        assert e.value.code == grpc.StatusCode.NOT_FOUND and "'nope'" in e.value.details


@pytest.mark.parametrize(
    "tables, code, words",
    [
        ({"batch": {"size": 0}}, "INVALID_ARGUMENT", ["`batch.size`", "0"]),
        ({"batch": {"packing": "zigzag"}}, "INVALID_ARGUMENT", ["`batch.packing`", "zigzag"]),
        ({"shard": {"index": 3, "count": 2}}, "INVALID_ARGUMENT", ["`shard.index`", "3"]),
        ({"source": {"format": "csv"}}, "INVALID_ARGUMENT", ["`source.format`", "csv"]),
        ({"source": {"text_field": "body"}}, "INVALID_ARGUMENT", ["text_field", "body"]),
        ({"workers": {"count": "lots"}}, "INVALID_ARGUMENT", ["`workers.count`", "lots"]),
        # Relative: inside the server's data root (its working directory, pytest's basetemp).
        ({"source": {"paths": ["no/such/file.jsonl"]}}, "NOT_FOUND", ["no/such/file.jsonl"]),
        ({"source": {"paths": ["no_such_*.jsonl"]}}, "NOT_FOUND", ["glob", "no_such_*.jsonl"]),
        (
            {"tokenizer": {"model": "no/such.model"}},
            "NOT_FOUND",
            ["tokenizer.model", "no/such.model"],
        ),
        # Outside it: refused whether or not the file exists.
        (
            {"source": {"paths": ["/no/such/file.jsonl"]}},
            "PERMISSION_DENIED",
            ["/no/such/file.jsonl", "data roots"],
        ),
        (
            {"tokenizer": {"model": "/etc/hostname"}},
            "PERMISSION_DENIED",
            ["tokenizer.model", "/etc/hostname", "data roots"],
        ),
    ],
    ids=[
        "size",
        "packing",
        "shard",
        "format",
        "text_field",
        "workers",
        "missing-file",
        "empty-glob",
        "missing-model",
        "outside-file",
        "outside-model",
    ],
)
def test_invalid_spec_is_refused_with_status_and_message(target, make_spec, tables, code, words):
    # Sent as any client could send it: the client's own PipelineSpec refuses most of these
    # before they leave (tests/unit/test_spec.py), so the proto is edited after the fact.
    msg = make_spec().to_proto()
    for table, keys in tables.items():
        for key, value in keys.items():
            if isinstance(value, list):
                getattr(getattr(msg, table), key)[:] = value
            else:
                setattr(getattr(msg, table), key, value)
    with pytest.raises(grpc.RpcError) as e:
        raw_messages(target, msg)
    assert e.value.code() == getattr(grpc.StatusCode, code)
    for w in words:
        assert w in e.value.details()
    assert "Traceback" not in e.value.details()


def test_not_a_sentencepiece_model_is_invalid(client, make_spec, corpus):
    with pytest.raises(StreamError) as e:
        next(client.batches(make_spec(tokenizer={"model": corpus})))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a sentencepiece model" in e.value.details and corpus in e.value.details


def test_bad_resume_state_is_invalid(client, make_spec):
    with client.batches(make_spec()) as it:
        next(it)
        state = it.get_state()
    with pytest.raises(StreamError) as e:
        next(client.batches(make_spec(order={"seed": 3}), state=state))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "other data" in e.value.details


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "worker-process"])
def test_bad_record_mid_stream_is_data_loss_naming_file_and_line_not_retried(
    client, make_spec, docs, tmp_path, workers
):
    path = tmp_path / "broken.jsonl"
    lines = [json.dumps({"text": d}) for d in docs[:300]]
    lines[150] = '{"text": "unterminated'
    path.write_text("\n".join(lines) + "\n")
    it = client.batches(
        make_spec(
            source={"paths": [str(path)]}, order={"shuffle": False}, workers={"count": workers}
        ),
        reconnect_deadline_s=60,
    )
    start = time.monotonic()
    with pytest.raises(StreamError) as e:
        list(it)
    assert time.monotonic() - start < 30  # not retried until the reconnect deadline
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert f"{path} line 151" in e.value.details
    assert it.reconnects == 0
    # The server is fine for the next stream.
    with client.batches(make_spec()) as again:
        assert_same_batches([next(again)], run_pipeline(make_spec(), limit=1))


def test_concurrent_streams_each_get_their_own_data(server, make_spec):
    a_spec, b_spec = make_spec(), make_spec(order={"seed": 5})
    tcp = server.targets[1]
    with InputClient(server.targets[0]) as c1, InputClient(tcp, token=TOKENS[tcp]) as c2:
        a, b = c1.batches(a_spec), c2.batches(b_spec)
        got_a, got_b = [], []
        for x, y in zip(a, b, strict=False):  # interleaved: both streams open at once
            got_a.append(x)
            got_b.append(y)
        got_a.extend(a)
        got_b.extend(b)
    assert_same_batches(got_a, run_pipeline(a_spec))
    assert_same_batches(got_b, run_pipeline(b_spec))


def test_stream_limit_gives_resource_exhausted_and_health_still_answers(tmp_path, make_spec):
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], max_streams=1)) as srv,
        InputClient(srv.targets[0]) as client,
    ):
        with client.batches(make_spec(order={"epochs": 0})) as first:
            next(first)
            with pytest.raises(StreamError) as e:
                next(client.batches(make_spec()))
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert health(srv.targets[0]) == health_pb2.HealthCheckResponse.SERVING


def test_slow_client_keeps_server_queue_bounded(tmp_path, make_spec):
    # 256 KiB batches on the wire (uint16 ids, 2048 x 64; two to a message), so gRPC's
    # flow-control window holds only a few; unbounded, the pipeline would make hundreds while
    # the client sleeps.
    spec = make_spec(batch={"seq_len": 2048, "size": 64}, order={"epochs": 0})
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], queue_depth=2)) as srv,
        InputClient(srv.targets[0]) as client,
    ):
        with client.batches(spec, prefetch=1) as it:
            next(it)
            time.sleep(3)  # a stalled trainer; unbounded, the pipeline would make hundreds
            (stream,) = client.info().streams
            produced_early = stream.batches_produced
            time.sleep(1)
            (stream,) = client.info().streams
        # Bounded: the server queue, the client's prefetch and gRPC's flow-control window.
        assert stream.batches_produced == produced_early
        assert stream.batches_produced * 256 * 1024 < 16 << 20


def test_disconnect_tears_down_stream_and_worker_processes(server, make_spec):
    before = {p.pid for p in worker_processes()}
    client = InputClient(server.targets[0])
    it = client.batches(make_spec(workers={"count": 2}, order={"epochs": 0}))
    next(it)
    workers = worker_processes(exclude=before)
    assert len(workers) >= 2  # the stream really runs worker processes
    it.close()
    client.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        alive = still_running(workers)
        if not alive and not server._servicer._streams.info()[0]:
            break
        time.sleep(0.2)
    assert not alive, alive
    assert not server._servicer._streams.info()[0]  # no stream left open


def test_health_reports_serving(target):
    assert health(target, service="") == health_pb2.HealthCheckResponse.SERVING


def test_stop_ends_streams_with_unavailable(tmp_path, make_spec):
    srv = Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], grace_s=2))
    client = InputClient(srv.targets[0])
    # Reconnecting off: the drain's own status reaches the caller
    # (tests/integration/test_reconnect.py covers the reconnect that follows by default).
    it = client.batches(make_spec(order={"epochs": 0}), prefetch=1, reconnect_deadline_s=0)
    next(it)
    srv.stop()
    assert not (tmp_path / "s.sock").exists()
    with pytest.raises(StreamError) as e:
        for _ in range(1000):
            next(it)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    client.close()


def test_small_batches_share_messages_each_whole_and_in_order(target, make_spec):
    from input_client.wire import decode_batch
    from input_server.serving.coalesce import MAX_BATCHES_PER_MESSAGE

    spec = make_spec(batch={"seq_len": 64, "size": 2})  # 128 tokens: many per message
    messages = raw_messages(target, spec, pause_s=0.5)
    assert any(len(m.following) > 0 for m in messages)  # coalesced...
    assert all(len(m.following) + 1 <= MAX_BATCHES_PER_MESSAGE for m in messages)
    assert all(not f.following for m in messages for f in m.following)  # ...never nested
    batches = [b for m in messages for b in (m, *m.following)]
    assert [b.sequence_number for b in batches] == list(range(len(batches)))
    assert batches[-1].end_of_data and not messages[-1].following  # the end marker alone
    assert_same_batches([decode_batch(b.tensors) for b in batches[:-1]], run_pipeline(spec))
    states = [json.loads(b.state) for b in batches[:-1]]
    assert [s["seq"] for s in states] == list(range(1, len(batches)))  # each its own state


def test_batches_of_a_full_message_travel_alone(target, make_spec):
    from input_server.serving.coalesce import MESSAGE_TOKENS

    spec = make_spec(batch={"seq_len": 1024, "size": MESSAGE_TOKENS // 1024}, order={"epochs": 8})
    messages = raw_messages(target, spec, pause_s=0.5)
    assert len(messages) > 2 and not any(m.following for m in messages)


def test_a_slow_pipelines_batch_waits_at_most_the_coalescing_bound(make_spec):
    """Batches that come slower than COALESCE_WAIT_S apart go without waiting for company:
    each message leaves within the bound (plus scheduling) of its first batch being made."""
    from input_server.batching.batch_stream import BatchStream
    from input_server.batching.pipeline import MIN_GROUP
    from input_server.batching.resume import Position
    from input_server.serving.coalesce import COALESCE_WAIT_S
    from input_server.serving.session import StreamSession
    from input_server.testing import SlowPipeline

    spec = make_spec(batch={"seq_len": 64, "size": 2})  # 128 tokens: 16 a message if they wait
    pipeline = SlowPipeline(spec, delay_s=0.02)
    pipeline.group_size = MIN_GROUP  # a group (a burst of batches) every 8 x 20 ms
    stream = BatchStream(pipeline, Position(), Parallelism(0, 1))  # one never switched
    session = StreamSession(1, "slow", stream, depth=16)
    made: dict[int, float] = {}  # batches made so far -> when that count was first seen

    def watch():
        while not stop:
            made.setdefault(session.batches_produced, time.monotonic())
            time.sleep(0.001)

    stop = False
    watcher = threading.Thread(target=watch)
    watcher.start()
    waits, sizes = [], []
    try:
        for msg, error in session:
            assert error is None
            if msg is None:
                continue
            sent = time.monotonic()
            first = msg.sequence_number
            # When batch `first` was made: when the count first reached past it.
            waits.append(sent - min((t for n, t in list(made.items()) if n > first), default=sent))
            sizes.append(1 + len(msg.following))
            if len(sizes) == 12:
                break
    finally:
        stop = True
        watcher.join()
        session.stop()
        session.join(5)
    assert not session.is_alive()
    # Unbounded, a message would wait for 16 batches: ~4 groups, 0.3 s and more
    # (measured 0.33 s with the bound lifted; ~0.02 s with it).
    assert max(sizes) < 8, sizes
    assert max(waits) < max(0.2, 2 * COALESCE_WAIT_S), (waits, sizes)


@pytest.mark.parametrize("version", [0, 1, 99])
def test_stream_request_of_another_wire_protocol_is_refused(target, make_spec, version):
    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    with dial(target) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        call = stub.StreamBatches(
            iter([pb.StreamBatchesRequest(spec=make_spec().to_proto(), protocol_version=version)])
        )
        with pytest.raises(grpc.RpcError) as e:
            next(call)
        assert stub.GetInfo(pb.GetInfoRequest()).protocol_version == PROTOCOL_VERSION
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    theirs = "one from before versions were sent" if version == 0 else str(version)
    assert (
        f"speaks wire protocol {PROTOCOL_VERSION}; the client speaks {theirs}" in e.value.details()
    )


def test_message_tokens_sets_how_many_batches_share_a_message(tmp_path, make_spec):
    spec = make_spec(batch={"seq_len": 64, "size": 2})  # 128 tokens a batch
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], message_tokens=128)) as srv:
        alone = raw_messages(srv.targets[0], spec, pause_s=0.5)
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/t.sock"], message_tokens=512)) as srv:
        four = raw_messages(srv.targets[0], spec, pause_s=0.5)
    assert not any(m.following for m in alone)
    assert max(1 + len(m.following) for m in four) == 4  # 512 // 128, the queue full
    from input_client.wire import decode_batch

    batches = [
        [decode_batch(b.tensors) for m in ms for b in (m, *m.following) if not b.end_of_data]
        for ms in (alone, four)
    ]
    assert_same_batches(batches[0], batches[1])  # the same batches either way
    with pytest.raises(ValueError, match="message_tokens"):
        ServerConfig(message_tokens=0)


def test_workers_threads_sets_the_threads_of_a_fixed_count(tmp_path, make_spec):
    spec = make_spec(workers={"count": 0, "threads": 3})
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec) as it,
    ):
        got = [next(it), next(it)]
        (stream,) = client.info().streams
    assert (stream.worker_processes, stream.worker_threads) == (0, 3)
    assert "workers.threads" in stream.worker_reason
    assert_same_batches(got, run_pipeline(make_spec(), limit=2))
