"""Grain's own Prometheus telemetry beside ours: a server started with
ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true (Grain then serves port 9431 on every interface, so the
server runs in a network namespace of its own) and --metrics-port; after a stream, both pages
answer, ours with every input_server_* metric and nothing of Grain's, Grain's with none of ours.
Skipped, with the kernel's reason, where network namespaces cannot be made."""

from __future__ import annotations

import os
import queue
import subprocess
import sys

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from input_server.serving.metrics import GRAIN_PORT
from tests.support import ChildProcess, cli_argv, stream_status
from tests.support.netns import Hosts, Unavailable

PORT = 9400
FETCH = (
    "import sys, urllib.request; "
    "sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())"
)


@pytest.fixture(scope="module")
def host():
    try:
        h = Hosts.make(1, tag=f"gt{os.getpid() % 100000}")
    except Unavailable as e:
        if os.environ.get("CI") == "true" and os.geteuid() == 0:
            raise
        pytest.skip(f"network namespaces cannot be made here: {e}")
    with h:
        yield h


def _page(host: Hosts, port: int) -> dict[str, list]:
    """The page at 127.0.0.1:PORT inside the namespace: metric families by name."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = subprocess.run(
        host.argv(0, [sys.executable, "-c", FETCH, url]),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_ours_and_grains_pages_stand_apart(host, tmp_path, make_spec, corpus):
    sock, log = f"unix://{tmp_path}/s.sock", str(tmp_path / "serve.log")
    argv = cli_argv("serve", "--listen", sock, "--metrics-port", str(PORT))
    env = {**os.environ, "ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY": "true"}
    child = ChildProcess(
        host.argv(0, [*argv, "--data-root", os.path.dirname(corpus)]),
        log=log,
        read_lines=True,
        env=env,
    )
    try:
        try:
            line = child.lines.get(timeout=60) or ""
        except queue.Empty:
            line = ""
        assert "serving on" in line, open(log).read()[-2000:]
        # The Unix socket is a file: reachable from outside the namespace.
        assert stream_status(sock, make_spec().to_proto(), take=3)[0] == grpc.StatusCode.OK
        ours = _page(host, PORT)
        grains = _page(host, GRAIN_PORT)
    finally:
        child.kill()
    for name in (
        "input_server_batches_sent",
        "input_server_tokens_sent",
        "input_server_bytes_sent",
        "input_server_active_streams",
        "input_server_stage_seconds",
        "input_server_client_exposed_wait_seconds",
        "input_server_parallelism",
        "input_server_stream_errors",
        "input_server_streams_opened",
        "input_server_build_info",
    ):
        assert name in ours, (name, sorted(ours))
    # Our registry is our own: neither Grain's metrics nor prometheus-client's default
    # process and GC collectors.
    assert all(n.startswith("input_server_") for n in ours), sorted(ours)
    assert not any(n.startswith("input_server_") for n in grains), sorted(grains)
