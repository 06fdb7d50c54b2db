"""What a server's operator sees: `-v` taken after the verb, and a client's own leaving
counted apart from the stream errors on the real metrics page."""

from __future__ import annotations

import os
import time

import grpc

from tests.support import serve_cli, stream_status
from tests.support.metrics import scrape


def test_verbose_after_the_verb_logs_at_info(short_tmp, corpus):
    """`serve -v` (the flag where people add it, at the end) serves and logs at INFO: the
    server's "serving on" and the stream's end, which the default WARNING level leaves out."""
    log = os.path.join(short_tmp, "serve.log")
    sock = f"unix://{short_tmp}/s.sock"
    child, _ = serve_cli("--listen", sock, "-v", log=log)
    try:
        status = stream_status(sock, _missing_spec(corpus).to_proto())[0]
        assert status == grpc.StatusCode.NOT_FOUND
        time.sleep(0.5)  # a stream's end is logged as it closes
    finally:
        child.kill()
    with open(log) as f:
        text = f.read()
    assert "unrecognized arguments" not in text
    assert " INFO input_server.serving.server: serving on " in text, text[-2000:]
    assert "stream 1 ended: NOT_FOUND" in text, text[-2000:]


def _missing_spec(corpus):
    from input_client import PipelineSpec

    return PipelineSpec(
        source={"paths": [os.path.join(os.path.dirname(corpus), "missing.jsonl")]},
        tokenizer={"model": "unused.model"},
        batch={"seq_len": 128, "size": 4},
    )


def test_a_client_that_leaves_is_no_stream_error(short_tmp, make_spec, corpus):
    """A trainer that stops early cancels its stream: counted in streams_cancelled, not in
    stream_errors (an alert on errors would fire at every job's end); a refusal still is."""
    from input_client import InputClient
    from input_server.serving.server import Server, ServerConfig

    config = ServerConfig(listen=[f"unix://{short_tmp}/s.sock"], metrics_port=0)
    with Server(config) as srv, InputClient(srv.targets[0]) as client:
        port = srv.metrics_port
        with client.batches(make_spec(order={"epochs": 0})) as it:  # endless: only a cancel ends it
            for _ in range(3):
                next(it)
        refused = make_spec(source={"paths": [os.path.join(os.path.dirname(corpus), "no")]})
        assert stream_status(srv.targets[0], refused.to_proto())[0] == grpc.StatusCode.NOT_FOUND
        deadline = time.monotonic() + 20
        while (page := scrape(port)).get(("input_server_streams_cancelled_total", ())) != 1:
            assert time.monotonic() < deadline, page
            time.sleep(0.3)  # within the page's scrapes a second per peer (metrics.py)
    errors = {k[1][0][1]: v for k, v in page.items() if k[0] == "input_server_stream_errors_total"}
    assert errors.get("CANCELLED", 0) == 0, errors
    assert errors["NOT_FOUND"] == 1, errors
    assert page[("input_server_streams_opened_total", ())] == 2
