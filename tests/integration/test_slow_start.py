"""A first batch that takes over ~2 s gets one log line saying what the server is doing (a
new user once watched a tuning's 11-19 s with nothing on screen)."""

from __future__ import annotations

import logging

from input_client import InputClient
from input_server.serving.server import Server, ServerConfig


def test_a_slow_first_batch_says_why_once(tmp_path, make_spec, caplog):
    spec = make_spec(workers={"count": "auto", "tune_seconds": 5})
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv, \
            InputClient(srv.targets[0]) as client, \
            caplog.at_level(logging.WARNING, logger="input_client"):
        with client.batches(spec) as it:
            next(it)
            next(it)
    lines = [r.getMessage() for r in caplog.records if "no first batch" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "setting this stream up" in lines[0] and 'workers.count = "auto"' in lines[0]
    assert '((request)): setting up: tuning its workers ("auto", up to 5 s)' in lines[0]


def test_info_lists_a_stream_from_its_first_moment(tmp_path, make_spec):
    import threading
    import time

    spec = make_spec(workers={"count": "auto", "tune_seconds": 4})
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv, \
            InputClient(srv.targets[0]) as client:
        first = {}
        with client.batches(spec) as it:
            taker = threading.Thread(target=lambda: first.setdefault("batch", next(it)))
            taker.start()
            seen = []
            while taker.is_alive():
                seen += [(s.stream_id, s.worker_reason) for s in client.info().streams]
                time.sleep(0.1)
            taker.join()
            (running,) = client.info().streams
    reasons = [r for _, r in seen]
    assert any(r.startswith("setting up: tuning its workers") for r in reasons), reasons
    assert {i for i, _ in seen} == {running.stream_id}  # one stream, one id throughout
    assert running.worker_reason.startswith("auto")


def test_a_fast_first_batch_says_nothing(tmp_path, make_spec, caplog):
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv, \
            InputClient(srv.targets[0]) as client, \
            caplog.at_level(logging.WARNING, logger="input_client"):
        with client.batches(make_spec()) as it:
            next(it)
    assert not [r for r in caplog.records if "no first batch" in r.getMessage()]
