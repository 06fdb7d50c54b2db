"""A 200 MB document (it once took the server down: ~35 bytes of memory per character while
tokenized whole) is refused with INVALID_ARGUMENT naming file, line and limit, while another
client's stream keeps flowing. The server runs in its own process, watched: past 3 GB it is
killed, so a regression fails the test instead of the host."""

from __future__ import annotations

import json
import threading
import time

import psutil

from input_client import InputClient, StreamError
from tests.support import serve_cli

KILL_AT_BYTES = 3 << 30


def _watch(process: psutil.Process, stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.05):
        try:
            rss = process.memory_info().rss + sum(
                c.memory_info().rss for c in process.children(recursive=True)
            )
        except psutil.Error:
            return
        peak[0] = max(peak[0], rss)
        if rss > KILL_AT_BYTES:
            process.kill()
            return


def test_a_200_mb_document_is_refused_and_other_streams_flow(tmp_path, make_spec, docs):
    huge = tmp_path / "huge.jsonl"
    with open(huge, "w") as f:
        f.write(json.dumps({"text": docs[0]}) + "\n")
        f.write('{"text": "' + "lorem ipsum " * (200 * (1 << 20) // 12) + '"}\n')
        f.write(json.dumps({"text": docs[1]}) + "\n")
    child, targets = serve_cli(
        "--listen", f"unix://{tmp_path}/s.sock", log=str(tmp_path / "server.log")
    )
    stop, peak = threading.Event(), [0]
    server = psutil.Process(child.p.pid)
    threading.Thread(target=_watch, args=(server, stop, peak), daemon=True).start()
    try:
        with (
            InputClient(targets[0], connect_timeout_s=60) as other_client,
            InputClient(targets[0], connect_timeout_s=60) as client,
        ):
            flowing = other_client.batches(make_spec(order={"epochs": 0}), prefetch=1)
            next(flowing)
            gaps: list[float] = []

            def consume():
                last = time.monotonic()
                while not stop.is_set():
                    next(flowing)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
                    time.sleep(0.01)

            consumer = threading.Thread(target=consume, daemon=True)
            consumer.start()
            for packing in ("first_fit", "concat_then_split"):
                spec = make_spec(source={"paths": [str(huge)]}, batch={"packing": packing})
                try:
                    next(client.batches(spec, reconnect_deadline_s=0))
                    raise AssertionError("the 200 MB document was streamed")
                except StreamError as e:
                    assert e.code.name == "INVALID_ARGUMENT", e
                    assert "huge.jsonl line 2" in e.details and "--max-document-mb 64" in e.details
            time.sleep(0.5)
            stop.set()
            consumer.join(10)
            flowing.close()
        assert server.is_running(), f"server killed at {peak[0] >> 20} MiB"
        assert len(gaps) > 10 and max(gaps) < 5.0, (len(gaps), max(gaps, default=0))
        assert peak[0] < 2 << 30, peak[0] >> 20
    finally:
        stop.set()
        child.kill()
