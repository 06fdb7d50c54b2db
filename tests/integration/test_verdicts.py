"""Each verdict of `input-server stats` on a real server, made by the stand-in for its cause
(`input_server.testing.slow`): slow storage, a costly tokenizer, a trainer faster than its
input, and one slower than it. And the accounting against the stand-ins' own clocks: the
worker stages scraped from the metrics endpoint add up to the time the workers spent."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import grpc
import pytest

from input_client import InputClient
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION
from input_server import cli
from input_server.serving.server import Server, ServerConfig
from input_server.serving.verdict import MORE_CPU
from tests.support import serve_servicer, wait_for
from tests.support.metrics import scrape
from tests.support.proxy import RecordingProxy
from tests.support.verdicts import DELAY_S, slow_pipeline


@pytest.fixture
def serve(short_tmp):
    """`serve(**pipelines)`: a real server with these named pipelines and a metrics port."""
    with contextlib.ExitStack() as stack:

        def start(**pipelines) -> Server:
            config = ServerConfig(
                listen=[f"unix://{short_tmp}/s.sock"], pipelines=pipelines, metrics_port=0
            )
            return stack.enter_context(Server(config))

        yield start


@contextlib.contextmanager
def silent_client(target: str, name: str):
    """A client from before credit: one request (window 0, no reports, so no data wait said),
    every message read as fast as it comes, on a thread."""
    channel = grpc.insecure_channel(target)
    request = pb.StreamBatchesRequest(pipeline_name=name, protocol_version=PROTOCOL_VERSION)
    call = pb_grpc.InputServiceStub(channel).StreamBatches(iter([request]))

    def drain():
        with contextlib.suppress(grpc.RpcError):
            for _ in call:
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield
    finally:
        call.cancel()
        reader.join(10)
        channel.close()


def settled(client: InputClient, it=None, pace_s: float = 0.0) -> pb.StreamStats:
    """The stream's stats once its verdict is past "starting", taking batches meanwhile from
    `it` (every `pace_s`) when given."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if it is not None:
            next(it)
            time.sleep(pace_s)
        else:
            time.sleep(0.2)
        streams = client.info().streams
        if streams and streams[0].stats.verdict_kind not in ("", "starting"):
            return streams[0].stats
    raise AssertionError(f"no verdict in 60 s: {client.info().streams}")


def test_slow_storage_is_read_bound(serve, make_spec):
    srv = serve(reads=slow_pipeline(make_spec(order={"epochs": 0}), read_s=DELAY_S))
    with silent_client(srv.targets[0], "reads"), InputClient(srv.targets[0]) as client:
        stats = settled(client)
    assert stats.verdict_kind == "read-bound", stats.verdict
    assert "of worker time reading records" in stats.verdict
    assert "its client does not report the trainer's wait" in stats.verdict
    assert stats.client_wait_share == -1  # not reported, not taken for 0


def test_a_costly_tokenizer_is_tokenizer_bound(serve, make_spec):
    srv = serve(tokens=slow_pipeline(make_spec(order={"epochs": 0}), tokenize_s=DELAY_S))
    with silent_client(srv.targets[0], "tokens"), InputClient(srv.targets[0]) as client:
        stats = settled(client)
    assert stats.verdict_kind == "tokenizer-bound", stats.verdict
    assert "of worker time in sentencepiece" in stats.verdict


def test_a_trainer_faster_than_its_input_is_input_bound(serve, make_spec):
    srv = serve(reads=slow_pipeline(make_spec(order={"epochs": 0}), read_s=DELAY_S))
    with InputClient(srv.targets[0]) as client, client.batches("reads") as it:
        stats = settled(client, it)
    assert stats.verdict_kind == "input-bound", stats.verdict
    assert "of worker time reading records" in stats.verdict and MORE_CPU in stats.verdict
    assert "x demand" in stats.verdict  # production against the loop's pace
    assert stats.client_wait_share >= 0.05 and stats.client_wait_s > 0


def test_a_trainer_slower_than_its_input_is_client_bound(serve, make_spec):
    srv = serve(fast=slow_pipeline(make_spec(order={"epochs": 0})))
    with InputClient(srv.targets[0]) as client, client.batches("fast") as it:
        stats = settled(client, it, pace_s=0.1)
    assert stats.verdict_kind == "client-bound", stats.verdict
    assert "nothing to do here" in stats.verdict
    assert 0 <= stats.client_wait_share < 0.01


def test_a_slow_way_between_server_and_trainer_is_delivery_bound(serve, make_spec, short_tmp):
    """A proxy that holds each batch 40 ms stands in for a far network (or a client's busy
    process): the trainer waits while the server, its batches sent, waits for credit."""
    srv = serve(fast=slow_pipeline(make_spec(order={"epochs": 0})))
    proxy = RecordingProxy(srv.targets[0], delay_s=0.04)
    target = f"unix://{short_tmp}/p.sock"
    with (
        serve_servicer(proxy, target),
        InputClient(target) as client,
        client.batches("fast") as it,
    ):
        stats = settled(client, it)
    proxy.close()
    assert stats.verdict_kind == "delivery-bound", stats.verdict
    assert "not the input pipeline" in stats.verdict


@pytest.mark.alone  # stage clocks within 10 % of the stand-ins': others' load adds work
def test_worker_stages_add_up_to_the_workers_time(serve, make_spec):
    """Over one epoch on two threads: the read and tokenize seconds the metrics endpoint
    shows are what the stand-ins' calls took by their own clocks (within 10 %: the stage
    clock is around the call). Their own clocks take the real work in: a burner beside the
    suite slowed it past a margin meant for the stage's overhead alone."""
    spec = make_spec(order={"epochs": 1}, workers={"count": 0, "threads": 2})
    pipeline = slow_pipeline(spec, read_s=DELAY_S, tokenize_s=DELAY_S)
    srv = serve(both=pipeline)
    with InputClient(srv.targets[0]) as client, client.batches("both") as it:
        assert sum(1 for _ in it) > 0
    ended = ("input_server_active_streams", ())  # its figures join the totals as it ends
    page = wait_for(lambda: (p := scrape(srv.metrics_port))[ended] == 0 and p, "the end")
    stage = {k[1][0][1]: v for k, v in page.items() if k[0] == "input_server_stage_seconds_total"}
    read, tokenize = pipeline.source.spent, pipeline.tokenizer.spent
    assert read.calls == tokenize.calls == pipeline.docs_per_epoch  # every document once
    why = (stage, read.seconds, tokenize.seconds)  # the stand-ins' own clocks
    assert read.seconds <= stage["read"] + stage["decompress"] <= 1.1 * read.seconds, why
    assert tokenize.seconds <= stage["tokenize"] <= 1.1 * tokenize.seconds, why


def test_stats_shows_the_verdict_and_where_the_time_goes(serve, make_spec, capsys):
    srv = serve(reads=slow_pipeline(make_spec(order={"epochs": 0}), read_s=DELAY_S))
    with silent_client(srv.targets[0], "reads"), InputClient(srv.targets[0]) as client:
        settled(client)
        assert cli.main(["stats", srv.targets[0]]) == 0
        table = capsys.readouterr().out
        assert table.splitlines()[0].endswith(": 1 stream running"), table  # not "1 streams"
        assert "verdict   read-bound: " in table, table
        assert "workers   read " in table and "stream    wait_workers " in table, table
        watch = ["--json", "--watch", "--count", "2", "--interval-s", "0.2"]
        assert cli.main(["stats", srv.targets[0], *watch]) == 0
    readings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(readings) == 2 and readings[1]["at"] > readings[0]["at"]
    for r in readings:
        (stream,) = r["streams"]
        assert stream["stats"]["verdictKind"] == "read-bound"
        assert int(r["totals"]["streamsOpened"]) == 1
