"""A first batch that takes over ~2 s gets one log line saying what the server is doing (a
new user once watched 11-19 s with nothing on screen)."""

from __future__ import annotations

import logging
import threading
import time

from input_client import InputClient
from input_server.batching.parallelism import default_threads
from input_server.batching.pipeline import MIN_GROUP
from input_server.serving.server import Server, ServerConfig
from input_server.testing import SlowPipeline


def slow_server(tmp_path, spec) -> Server:
    """A server whose pipeline "slow" takes ~3 s for its first group (storage at 0.4 s a
    record, 8 records a group)."""
    pipeline = SlowPipeline(spec, delay_s=0.0)  # its sample of 64 records read at once
    pipeline.source.delay_s = 0.4
    pipeline.group_size = MIN_GROUP
    return Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], pipelines={"slow": pipeline}))


def test_a_slow_first_batch_says_why_once(tmp_path, make_spec, caplog):
    spec = make_spec(workers={"count": "auto"})
    with (
        slow_server(tmp_path, spec) as srv,
        InputClient(srv.targets[0]) as client,
        caplog.at_level(logging.WARNING, logger="input_client"),
    ):
        with client.batches("slow") as it:
            next(it)
            next(it)
    lines = [r.getMessage() for r in caplog.records if "no first batch" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "making its first batch" in lines[0]
    threads = default_threads(0)  # the provisional start: in process, the default threads
    assert (
        f"stream 1 (slow): 0 batches produced, 0 processes x {threads} threads (searching)"
        in lines[0]
    )


def test_info_lists_a_stream_from_its_first_moment(tmp_path, make_spec):
    spec = make_spec(workers={"count": "auto"})
    with slow_server(tmp_path, spec) as srv, InputClient(srv.targets[0]) as client:
        first = {}
        with client.batches("slow") as it:
            taker = threading.Thread(target=lambda: first.setdefault("batch", next(it)))
            taker.start()
            seen = []
            while taker.is_alive():
                seen += [(s.stream_id, s.worker_reason) for s in client.info().streams]
                time.sleep(0.1)
            taker.join()
            (running,) = client.info().streams
    reasons = [r for _, r in seen]
    assert len(reasons) >= 10, reasons  # listed throughout the ~3 s before its first batch
    assert {i for i, _ in seen} == {running.stream_id}  # one stream, one id throughout
    assert all(r.startswith(("setting up", "auto: started at once")) for r in reasons), reasons


def test_a_fast_first_batch_says_nothing(tmp_path, make_spec, caplog):
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
        caplog.at_level(logging.WARNING, logger="input_client"),
    ):
        with client.batches(make_spec()) as it:
            next(it)
    assert not [r for r in caplog.records if "no first batch" in r.getMessage()]
