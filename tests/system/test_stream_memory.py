"""A stream's resident memory grows within what the server's budget check says it may hold."""

from __future__ import annotations

import time

import psutil

from input_client import InputClient
from input_server.batching.budget import StreamBudget
from input_server.batching.parallelism import Parallelism
from input_server.serving.coalesce import MESSAGE_TOKENS, batches_per_message
from tests.support import serve_cli


def test_a_streams_resident_growth_stays_within_its_estimate(tmp_path, make_spec):
    child, targets = serve_cli(
        "--listen",
        f"unix://{tmp_path}/s.sock",
        "--queue-depth",
        "8",
        log=str(tmp_path / "server.log"),
    )
    try:
        server = psutil.Process(child.p.pid)
        with InputClient(targets[0], connect_timeout_s=60) as client:
            with client.batches(make_spec(), prefetch=1) as it:  # warm: imports, the model
                next(it)
            time.sleep(0.5)
            before = server.memory_info().rss
            # 2 MiB of tokens a batch: the queue, a message and the batches in flight hold
            # tens of MiB; the client takes one and waits, so the server's queue fills.
            big = make_spec(batch={"size": 16, "seq_len": 8192}, order={"epochs": 0})
            with client.batches(big, prefetch=1) as it:
                next(it)
                peak = 0
                for _ in range(30):
                    time.sleep(0.1)
                    peak = max(peak, server.memory_info().rss)
                next(it)
        per_message = batches_per_message(16, 8192, MESSAGE_TOKENS)
        budget = StreamBudget.of(big, limit_mb=2048, queue_depth=8, per_message=per_message)
        estimate = budget.held_mb(Parallelism(0, 2))
        grew_mb = (peak - before) / (1 << 20)
        assert grew_mb > 8 * 16 * 8192 * 4 / (1 << 20) / 2, grew_mb  # the queue did fill
        assert grew_mb < estimate, (grew_mb, estimate)
    finally:
        child.kill()
