"""The bench's sampler of the server's memory and threads runs in the client's process: its
own CPU is not the client's."""

from __future__ import annotations

import time

import psutil

from input_server.tools.bench_server import _Held


def test_the_samplers_own_cpu_is_taken_out_of_the_clients():
    held = _Held(psutil.Process())  # samples this process: children, RSS, threads
    time.sleep(0.5)
    result = {"tokens": 1000, "cpu_ns_per_token": 1e9}  # 1 s of client CPU
    held(result)
    own = held._cpu_s
    assert own > 0  # five samples of /proc cost something
    assert result["cpu_ns_per_token"] == 1e9 - 1e9 * own / 1000
    assert result["server_threads"] >= 1 and result["server_rss_mb"] > 0
