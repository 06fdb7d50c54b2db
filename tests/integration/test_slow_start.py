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


def test_a_fast_first_batch_says_nothing(tmp_path, make_spec, caplog):
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv, \
            InputClient(srv.targets[0]) as client, \
            caplog.at_level(logging.WARNING, logger="input_client"):
        with client.batches(make_spec()) as it:
            next(it)
    assert not [r for r in caplog.records if "no first batch" in r.getMessage()]
