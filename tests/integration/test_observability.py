"""Seeing inside a real server: its Prometheus page scraped while a stream runs, gRPC
reflection listing its services on a Unix socket (behind the token on TCP), the metrics port's
mistakes in one line, and `serve --log-format json` read back from a real process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request

import grpc
import pytest

from tests.support import (
    ChildProcess,
    assert_one_line,
    cli_argv,
    dial,
    free_port,
    run_main,
    wait_for,
    write_token_file,
)
from tests.support.metrics import scrape

SERVICES = {
    "input_server.v1.InputService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}


@pytest.fixture
def metrics_server(short_tmp):
    from input_server.serving.server import Server, ServerConfig

    config = ServerConfig(listen=[f"unix://{short_tmp}/s.sock"], metrics_port=0)
    with Server(config) as srv:
        yield srv


@contextlib.contextmanager
def held_stream(target: str, spec):
    """A raw stream that has sent its first message and is then left unread (the server
    holds it open, its queue full); cancelled when the block ends. Yields the messages read
    so far and a function that reads one more."""
    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    with grpc.insecure_channel(target) as channel:
        call = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter(
                [pb.StreamBatchesRequest(spec=spec.to_proto(), protocol_version=PROTOCOL_VERSION)]
            ),
            timeout=60,
        )
        read = [next(call)]
        try:
            yield read, lambda: read.append(next(call))
        finally:
            call.cancel()


def _batches(messages) -> int:
    return sum(1 + len(m.following) for m in messages)


def test_live_streams_show_as_gauges_and_go_when_they_end(metrics_server, make_spec):
    port, target = metrics_server.metrics_port, metrics_server.targets[0]
    # Endless, so the stream is still live when a page newer than the one below is rendered.
    spec = make_spec(workers={"count": 0, "threads": 2}, order={"epochs": 0})
    assert scrape(port)[("input_server_active_streams", ())] == 0
    with held_stream(target, spec):
        # A page is answered again for up to PAGE_TTL_S: the one above may still be it.
        page = wait_for(lambda: (p := scrape(port))[("input_server_active_streams", ())] and p)
        assert page[("input_server_active_streams", ())] == 1
        assert page[("input_server_parallelism", (("kind", "processes"),))] == 0
        assert page[("input_server_parallelism", (("kind", "threads"),))] == 2
    wait_for(lambda: scrape(port)[("input_server_active_streams", ())] == 0)
    assert ("input_server_build_info", (("version", _version()),)) in scrape(port)


def _version() -> str:
    from input_server import __version__

    return __version__


def test_counters_move_with_the_batches(metrics_server, make_spec):
    """The counters follow what the loop takes: an endless stream under the client's credit
    sends only a window ahead of it, so taking more makes the server send more."""
    from input_client import InputClient

    port, target = metrics_server.metrics_port, metrics_server.targets[0]
    sent = ("input_server_batches_sent_total", ())
    with InputClient(target) as client, client.batches(make_spec(order={"epochs": 0})) as it:
        for _ in range(3):
            next(it)
        first = wait_for(lambda: (p := scrape(port))[sent] >= 3 and p, "3 batches sent")
        for _ in range(int(first[sent]) + 20):  # past all it had sent: it must send more
            next(it)
        later = wait_for(lambda: (p := scrape(port))[sent] > first[sent] and p)
        for name in ("input_server_bytes_sent_total", "input_server_streams_opened_total"):
            assert later[(name, ())] > first.get((name, ()), 0) or name.endswith("opened_total")
            assert later[(name, ())] > 0, name
        assert later[("input_server_tokens_sent_total", (("kind", "real"),))] > 0
        stages = {
            k[1][0][1]: v for k, v in later.items() if k[0] == "input_server_stage_seconds_total"
        }
        assert stages["tokenize"] > 0, stages


def test_stop_releases_the_metrics_port(short_tmp):
    from input_server.serving.server import Server, ServerConfig

    port = free_port()
    config = ServerConfig(listen=[f"unix://{short_tmp}/s.sock"], metrics_port=port)
    with Server(config):
        assert scrape(port)
    with pytest.raises(urllib.error.URLError):
        scrape(port)
    with Server(config):  # the same port again: released, not left in use
        assert scrape(port)


def test_a_metrics_port_in_use_is_one_line(capsys, short_tmp):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, err = run_main(
            capsys, "serve", "--listen", f"unix://{short_tmp}/s.sock", "--metrics-port", str(port)
        )
    assert_one_line(code, err, f"--metrics-port {port}", "in use")
    assert not os.path.exists(short_tmp / "s.sock"), "the socket bound before is removed"


def test_grains_port_is_refused_while_grains_telemetry_is_on(capsys, short_tmp, monkeypatch):
    monkeypatch.setenv("ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY", "true")
    argv = ("serve", "--listen", f"unix://{short_tmp}/s.sock", "--metrics-port", "9431")
    assert_one_line(*run_main(capsys, *argv), "Grain serves its own metrics there")


def _services(channel) -> set[str]:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    return set(ProtoReflectionDescriptorDatabase(channel).get_services())


def test_reflection_lists_the_services_on_a_unix_socket(metrics_server):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(metrics_server.targets[0]) as channel:
        assert _services(channel) == SERVICES
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        service = pool.FindServiceByName("input_server.v1.InputService")
        assert {"StreamBatches", "GetInfo", "DescribeTokenizer"} <= set(service.methods_by_name)


def test_reflection_is_behind_the_token(tmp_path):
    from input_server.serving.server import Server, ServerConfig

    token_file, token = write_token_file(tmp_path)
    with Server(ServerConfig(listen=["127.0.0.1:0"], token_file=token_file)) as srv:
        with dial(srv.targets[0], token="") as channel, pytest.raises(grpc.RpcError) as e:
            _services(channel)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with dial(srv.targets[0], token=token) as channel:
            assert _services(channel) == SERVICES


@pytest.fixture(scope="module")
def json_log(tmp_path_factory, corpus, spm_model):
    """`input-server -v serve --log-format json`, one stream of 3 messages run against it and
    one refused (a missing file), then SIGTERM: its stderr lines."""
    from input_client.spec import PipelineSpec
    from tests.support import stream_status

    folder = tmp_path_factory.mktemp("jsonlog")
    sock, log = f"unix://{folder}/s.sock", str(folder / "serve.log")
    argv = cli_argv("-v", "serve", "--listen", sock, "--log-format", "json")
    child = ChildProcess([*argv, "--data-root", os.path.dirname(corpus)], log=log, read_lines=True)
    try:
        assert "serving on" in (child.lines.get(timeout=60) or ""), open(log).read()[-2000:]
        spec = PipelineSpec(  # endless: it ends only as its client leaves, never first
            source={"paths": [corpus]},
            tokenizer={"model": spm_model},
            batch={"seq_len": 128, "size": 4},
            order={"epochs": 0},
            workers={"count": 0},
        )
        assert stream_status(sock, spec.to_proto(), take=3)[0] == grpc.StatusCode.OK
        missing = spec.replace(source={"paths": [os.path.join(os.path.dirname(corpus), "no")]})
        assert stream_status(sock, missing.to_proto())[0] == grpc.StatusCode.NOT_FOUND
        time.sleep(0.5)  # a stream's end is logged as it closes
        child.p.send_signal(signal.SIGTERM)
        assert child.p.wait(timeout=30) == 0
    finally:
        child.kill()
    with open(log) as f:
        return [line for line in f.read().splitlines() if line.strip()]


def test_every_json_log_line_is_an_object_with_the_standard_keys(json_log):
    assert json_log, "the server logged nothing at -v"
    for line in json_log:
        record = json.loads(line)  # a line that is not JSON fails here, named
        assert {"time", "level", "logger", "message"} <= set(record), line
    assert any("serving on" in json.loads(line)["message"] for line in json_log)


def test_a_stream_open_is_one_json_event_with_its_fields(json_log):
    """Needs the server's stream events (`extra={"event": ..., "fields": ...}`)."""
    events = [r for r in map(json.loads, json_log) if r.get("event") == "stream_open"]
    assert len(events) == 1, json_log
    fields = {"stream", "pipeline", "fingerprint", "processes", "threads", "reason"}
    assert fields <= set(events[0]), events[0]
    assert events[0]["processes"] == 0
    assert events[0]["token_cache"] == "off"  # no `serve --token-cache`


def test_each_stream_end_is_one_json_event_with_its_status(json_log):
    """The served stream ends as its client leaves (CANCELLED), the refused one with its
    status; each names its stream, and neither carries the request's text (its path)."""
    ends = [r for r in map(json.loads, json_log) if r.get("event") == "stream_end"]
    opened = [r for r in map(json.loads, json_log) if r.get("event") == "stream_open"]
    ends.sort(key=lambda e: e["stream"])  # the cancelled one may close after the refusal
    assert [(e["stream"], e["code"]) for e in ends] == [
        (opened[0]["stream"], "CANCELLED"),
        (opened[0]["stream"] + 1, "NOT_FOUND"),
    ], ends
    assert ends[0]["batches"] >= 3 and ends[1]["batches"] == 0
    assert all('"no"' not in json.dumps(e) and "/no" not in json.dumps(e) for e in ends)
