"""The metrics' collector on figures made up here (what a GetInfo response would carry), the
--metrics-* flags' refusals, and the JSON log lines: bounded labels, sums, one line each."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from input_client.proto import pb
from input_server import __version__
from input_server.serving.config import ServerConfig
from input_server.serving.logs import JsonFormatter
from input_server.serving.metrics import STAGES, ServerCollector


def _sample(registry: CollectorRegistry, name: str, **labels) -> float | None:
    return registry.get_sample_value(name, labels)


def _registry(info: pb.GetInfoResponse) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(lambda: info))
    return registry


def _info() -> pb.GetInfoResponse:
    totals = pb.ServerTotals(
        batches_sent=12,
        real_tokens=900,
        padding_tokens=100,
        bytes_sent=4096,
        stages=[
            pb.StageTime(stage="tokenize", seconds=1.5),
            pb.StageTime(stage="tokenize", seconds=0.5),  # two entries of one stage: summed
            pb.StageTime(stage="send", seconds=0.25),
            pb.StageTime(stage="/etc/passwd", seconds=9.0),  # not a stage: dropped
        ],
        client_wait_s=3.0,
        stream_ends={"OK": 5, "UNAVAILABLE": 2, "my own words": 1},
        streams_opened=9,
    )
    streams = [
        pb.StreamInfo(stream_id=1, worker_processes=2, worker_threads=3),
        pb.StreamInfo(stream_id=2, worker_processes=0, worker_threads=4),
    ]
    return pb.GetInfoResponse(server_version=__version__, streams=streams, totals=totals)


def test_counters_and_gauges_carry_the_responses_figures():
    r = _registry(_info())
    assert _sample(r, "input_server_batches_sent_total") == 12
    assert _sample(r, "input_server_tokens_sent_total", kind="real") == 900
    assert _sample(r, "input_server_tokens_sent_total", kind="padding") == 100
    assert _sample(r, "input_server_bytes_sent_total") == 4096
    assert _sample(r, "input_server_active_streams") == 2
    assert _sample(r, "input_server_client_exposed_wait_seconds_total") == 3.0
    assert _sample(r, "input_server_streams_opened_total") == 9
    assert _sample(r, "input_server_build_info", version=__version__) == 1
    # 2 processes of 3 threads, and 4 threads in the server's own process.
    assert _sample(r, "input_server_parallelism", kind="processes") == 2
    assert _sample(r, "input_server_parallelism", kind="threads") == 10


def test_stage_seconds_are_summed_by_stage_and_every_stage_is_there_from_the_start():
    r = _registry(_info())
    assert _sample(r, "input_server_stage_seconds_total", stage="tokenize") == 2.0
    assert _sample(r, "input_server_stage_seconds_total", stage="send") == 0.25
    for stage in set(STAGES) - {"tokenize", "send"}:
        assert _sample(r, "input_server_stage_seconds_total", stage=stage) == 0.0, stage


def test_labels_are_bounded_names_only():
    r = _registry(_info())
    assert _sample(r, "input_server_stream_errors_total", code="UNAVAILABLE") == 2
    # A clean end is no error; a code name gRPC does not have is never a label.
    assert _sample(r, "input_server_stream_errors_total", code="OK") is None
    page = generate_latest(r).decode()
    assert "my own words" not in page and "passwd" not in page


def test_an_idle_server_exposes_every_metric_at_zero():
    r = _registry(pb.GetInfoResponse(server_version=__version__))
    page = generate_latest(r).decode()
    for name in (
        "batches_sent_total",
        "tokens_sent_total",
        "bytes_sent_total",
        "active_streams",
        "stage_seconds_total",
        "client_exposed_wait_seconds_total",
        "parallelism",
        "stream_errors_total",
        "streams_opened_total",
        "build_info",
    ):
        assert f"# TYPE input_server_{name.removesuffix('_total')}" in page, name
    assert _sample(r, "input_server_batches_sent_total") == 0


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"metrics_port": 9400, "metrics_host": "0.0.0.0"}, "--insecure-metrics"),
        ({"metrics_port": 9400, "metrics_host": "10.0.0.7"}, "not a loopback address"),
        ({"metrics_host": "127.0.0.1"}, "add --metrics-port"),
        ({"insecure_metrics": True}, "add --metrics-port"),
        ({"metrics_port": 70000}, "out of range"),
    ],
    ids=["wildcard", "host-ip", "host-without-port", "insecure-without-port", "port-range"],
)
def test_metrics_flags_refused_with_the_way_out(settings, needle):
    with pytest.raises(ValueError, match=needle):
        ServerConfig(**settings)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "127.0.0.2"])
def test_loopback_metrics_hosts_need_no_reason(host):
    assert ServerConfig(metrics_port=0, metrics_host=host).metrics_host == host


def test_off_loopback_with_the_reason_is_accepted():
    config = ServerConfig(metrics_port=9400, metrics_host="0.0.0.0", insecure_metrics=True)
    assert config.insecure_metrics


def _line(record: logging.LogRecord) -> dict:
    text = JsonFormatter().format(record)
    assert "\n" not in text
    return json.loads(text)


def _record(msg="stream %d opened", args=(7,), exc_info=None, **extra) -> logging.LogRecord:
    logger = logging.getLogger("input_server.serving.stream")
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, msg, args, exc_info)
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_a_plain_record_has_the_standard_keys_only():
    line = _line(_record())
    assert set(line) == {"time", "level", "logger", "message"}
    assert line["message"] == "stream 7 opened" and line["level"] == "INFO"
    assert line["logger"] == "input_server.serving.stream"
    assert line["time"].endswith("+00:00") and "T" in line["time"]  # ISO 8601, UTC


def test_an_event_record_carries_its_event_and_fields_beside_the_standard_keys():
    fields = {"stream": 7, "pipeline": "wiki", "processes": 2, "message": "not mine"}
    line = _line(_record(event="stream_open", fields=fields))
    assert line["event"] == "stream_open"
    assert (line["stream"], line["pipeline"], line["processes"]) == (7, "wiki", 2)
    assert line["message"] == "stream 7 opened"  # a field never replaces a standard key


def test_an_exception_is_one_traceback_field():
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        line = _line(_record(exc_info=sys.exc_info()))
    assert line["traceback"].startswith("Traceback") and "RuntimeError: boom" in line["traceback"]
