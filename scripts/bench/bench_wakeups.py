"""Benchmark: how often one "auto" stream's server threads wake, with a slow consumer.

    python scripts/bench/bench_wakeups.py [--seconds 10] [--pace 2]

A server in this process streams the standard library's docstrings (a sentencepiece model
trained on them) with `workers.count = "auto"` to a client that takes `--pace` batches a
second. Every return from `threading.Condition.wait` (what `Event.wait`, `Queue.get`/`put`
with a timeout and `Condition.wait` all come down to) is counted by the waiting thread, over
`--seconds` after the first batch. Printed as JSON: wake-ups per second by thread kind (the
stream's producer, watchdog, tuner, credit reader, and its gRPC handler: the sender) and
their sum per stream.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import tempfile
import threading
import time

from input_client import InputClient, PipelineSpec
from input_server.batching.grain_adapter import ensure_absl_flags_parsed
from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl
from input_server.data.tokenizers.trainers import train_sentencepiece
from input_server.serving.server import Server, ServerConfig

# Thread names of one stream's server side (`serving/`), and what each does.
KINDS = (
    (re.compile(r"stream-\d+$"), "producer"),
    (re.compile(r"stream-\d+-watch$"), "watchdog"),
    (re.compile(r"stream-tuner$"), "tuner"),
    (re.compile(r"stream-credit$"), "credit reader"),
    (re.compile(r"rpc_\d+$"), "sender (gRPC handler)"),
)

_counts: collections.Counter = collections.Counter()
_counting = threading.Event()
_wait = threading.Condition.wait


def _counted_wait(self, timeout=None):
    try:
        return _wait(self, timeout)
    finally:
        if _counting.is_set():
            _counts[threading.current_thread().name] += 1


def kind_of(name: str) -> str | None:
    return next((kind for pattern, kind in KINDS if pattern.match(name)), None)


def run(seconds: float, pace: float) -> dict:
    ensure_absl_flags_parsed()
    threading.Condition.wait = _counted_wait
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # a server without --data-root reads from its working directory
        docs = stdlib_docstrings(1500)
        corpus = write_jsonl(docs, os.path.join(tmp, "corpus.jsonl"))
        model = train_sentencepiece(docs, os.path.join(tmp, "spm"), vocab_size=1000)
        spec = PipelineSpec(
            source={"paths": [corpus]},
            tokenizer={"model": model},
            batch={"seq_len": 128, "size": 4},
            order={"epochs": 0},
            workers={"count": "auto"},
        )
        with (
            Server(ServerConfig(listen=[f"unix://{tmp}/s.sock"])) as srv,
            InputClient(srv.targets[0]) as client,
            client.batches(spec, prefetch=1) as it,
        ):
            next(it)
            _counting.set()
            start = time.monotonic()
            taken = 0
            while time.monotonic() - start < seconds:
                next(it)
                taken += 1
                time.sleep(1 / pace)
            _counting.clear()
            elapsed = time.monotonic() - start
            (info,) = client.info().streams
    by_kind: collections.Counter = collections.Counter()
    for name, n in _counts.items():
        if (kind := kind_of(name)) is not None:
            by_kind[kind] += n
    per_s = {kind: round(by_kind[kind] / elapsed, 1) for _, kind in KINDS}
    return {
        "seconds": round(elapsed, 1),
        "consumer_batches_per_s": round(taken / elapsed, 2),
        "tuning_state": info.tuning_state,
        "parallelism": f"{info.worker_processes}x{info.worker_threads}",
        "wakeups_per_s": per_s,
        "wakeups_per_s_per_stream": round(sum(per_s.values()), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pace", type=float, default=2.0, help="batches taken a second")
    args = parser.parse_args()
    print(json.dumps(run(args.seconds, args.pace), indent=2))


if __name__ == "__main__":
    main()
