"""A server killed alone (SIGKILL to its pid, not its group) takes its worker processes with it:
each worker exits once its parent process is gone (`batching/grain_adapter.py`)."""

from __future__ import annotations

import os
import signal
import time

import psutil

from input_client import InputClient
from tests.support import ChildProcess, cli_argv


def test_a_sigkilled_servers_worker_processes_exit(tmp_path, make_spec):
    sock = tmp_path / "s.sock"
    server = ChildProcess(
        cli_argv("serve", "--listen", f"unix://{sock}"), log=str(tmp_path / "server.log")
    )
    try:
        spec = make_spec(order={"epochs": 0}, workers={"count": 2})
        with (
            InputClient(f"unix://{sock}", connect_timeout_s=60) as client,
            client.batches(spec, reconnect_deadline_s=0) as it,
        ):
            next(it)
            workers = psutil.Process(server.p.pid).children(recursive=True)
            assert len(workers) >= 2  # the stream's worker processes (and Python's helpers)
            os.kill(server.p.pid, signal.SIGKILL)  # the server alone, not its group
            server.p.wait(timeout=30)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(
                w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers
            ):
                time.sleep(0.05)
            alive = [
                w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE
            ]
            assert not alive, alive
    finally:
        server.kill()
