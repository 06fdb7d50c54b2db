"""Hostile clients at the sizes that once denied service (issue 18), against real servers.

  python scripts/bench/bench_hostile.py [--bomb-mb 3480] [--bombs 4] [--memory-gb 3] [--silent 24]
                                  [--files 1100] [--decompressed-mb 1024]

- bomb: a ~330 KB .jsonl.zst expanding to `--bomb-mb` MB inside the roots, sent `--bombs`
  times at once to a server in a memory cgroup of `--memory-gb` (cgroup v1 or v2, where this
  process may make one; else none, said in the JSON) whose --max-decompressed-mb is
  `--decompressed-mb` (its default): the statuses and seconds to them, the server's peak RSS,
  whether it lived, and the batches another client's stream took meanwhile;
- silent: `--silent` StreamBatches calls that never send their request, then 20 health checks
  and 20 GetInfo calls: their slowest answer;
- files: a server under `prlimit --nofile=1024:1024` streaming a glob of `--files` small files:
  the status and the most descriptors the server held;
- globs: one request's glob walk, in this process: 200 distinct globs and 10,000 copies of one
  over a 5,000-entry folder, CPU seconds each.
Prints JSON. Loopback only: every server listens on a Unix socket in a temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time

import grpc
import psutil

from input_client import InputClient, PipelineSpec
from input_client.proto import pb
from input_client.wire import PROTOCOL_VERSION
from input_server.data.builtin_corpora import stdlib_docstrings
from input_server.data.tokenizers.trainers import train_sentencepiece
from input_server.testing.files import jsonl_bytes, write_bytes
from input_server.testing.memory_bound import bounded_server
from input_server.testing.processes import cgroup_server, health
from input_server.testing.results import emit_json

STREAM = "/input_server.v1.InputService/StreamBatches"
_LINE = b'{"text": "' + b"all work and no play " * 48 + b'"}\n'


def _status(target: str, spec: PipelineSpec, timeout: float) -> tuple[str, str]:
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(
            STREAM, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        req = pb.StreamBatchesRequest(spec=spec.to_proto(), protocol_version=PROTOCOL_VERSION)
        try:
            for _ in call(iter([req.SerializeToString()]), timeout=timeout):
                pass
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""


def bomb(root: str, spec: PipelineSpec, mb: int, gb: float, bound_mb: int, at_once: int) -> dict:
    import zstandard

    path = os.path.join(root, "bomb.jsonl.zst")
    chunk = _LINE * ((1 << 20) // len(_LINE))
    c = zstandard.ZstdCompressor(level=3).compressobj()
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(c.compress(chunk))
        f.write(c.flush())
    flags = ("--max-decompressed-mb", str(bound_mb))
    with bounded_server(root, *flags, gb=gb) as server:
        target, p = server.target, server.process
        taken, stop = [0], threading.Event()

        def other() -> None:  # another client's stream, flowing meanwhile
            with (
                InputClient(target) as client,
                client.batches(spec.replace(order={"epochs": 0})) as it,
            ):
                for _ in it:
                    taken[0] += 1
                    if stop.is_set():
                        return

        flowing = threading.Thread(target=other, daemon=True)
        flowing.start()
        # The other stream is flowing: its first batch in (on a loaded 2-core host it took
        # longer than the 2 s this waited before, and the bombs found no stream to starve).
        deadline = time.monotonic() + 60
        while taken[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = taken[0]
        start = time.monotonic()
        answers: list[tuple[str, str]] = []
        bombs = [
            threading.Thread(
                target=lambda: answers.append(
                    _status(target, spec.replace(source={"paths": [path]}), 120)
                )
            )
            for _ in range(at_once)
        ]
        for t in bombs:
            t.start()
        for t in bombs:
            t.join()
        seconds = time.monotonic() - start
        statuses = sorted({a[0] for a in answers})
        status, message = answers[0] if len(statuses) == 1 else (",".join(statuses), answers[0][1])
        time.sleep(1.0)
        during = taken[0] - before
        alive = p.poll() is None
        peak = server.peak.bytes
        stop.set()
        flowing.join(10)
    return {
        "bomb_kb": os.path.getsize(path) >> 10,
        "bomb_mb": mb,
        "bombs_at_once": at_once,
        "cgroup_gb": server.gb,
        "status": status,
        "message": message[:400],
        "seconds": round(seconds, 2),
        "server_peak_rss_mb": round(peak / 2**20),
        "server_alive": alive,
        "other_stream_batches_meanwhile": during,
    }


def silent(root: str, n: int) -> dict:
    with cgroup_server(root) as (target, _), grpc.insecure_channel(target) as channel:
        release = threading.Event()

        def quiet():
            release.wait(60)
            yield from ()

        calls = channel.stream_stream(
            STREAM, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        for _ in range(n):
            threading.Thread(target=_drain, args=(calls(quiet()),), daemon=True).start()
        time.sleep(1.0)
        health_s, info_s = [], []
        with InputClient(target) as client:
            for _ in range(20):
                t = time.monotonic()
                health(target)
                health_s.append(time.monotonic() - t)
                t = time.monotonic()
                client.info()
                info_s.append(time.monotonic() - t)
        release.set()
    return {
        "silent_calls": n,
        "health_max_s": round(max(health_s), 3),
        "info_max_s": round(max(info_s), 3),
    }


def _drain(call) -> None:
    with contextlib.suppress(grpc.RpcError):
        for _ in call:
            pass


def files(root: str, spec: PipelineSpec, docs: list[str], n: int) -> dict:
    folder = os.path.join(root, "many")
    os.makedirs(folder)
    for i in range(n):
        write_bytes(os.path.join(folder, f"f{i:05d}.jsonl"), jsonl_bytes(docs[i % 50 : i % 50 + 2]))
    with cgroup_server(root, prefix=("prlimit", "--nofile=1024:1024")) as (target, p):
        most, stop = [0], threading.Event()

        def watch() -> None:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(p.pid)
                while not stop.wait(0.05):
                    most[0] = max(most[0], proc.num_fds())

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        status, message = _status(
            target, spec.replace(source={"paths": [f"{folder}/*.jsonl"]}), 120
        )
        stop.set()
        t.join()
    return {
        "files": n,
        "nofile_limit": 1024,
        "status": status,
        "message": message[:400],
        "server_most_fds": most[0],
    }


def globs(root: str) -> dict:
    from input_server.data.roots import DataAccess

    folder = os.path.join(root, "wide")
    os.makedirs(folder)
    for i in range(5000):
        open(os.path.join(folder, f"e{i}.txt"), "w").close()
    access = DataAccess(roots=(folder,), max_files=100_000)
    out = {}
    for label, patterns in [
        ("200_distinct_globs_cpu_s", [f"*{i}*" for i in range(200)]),
        ("10000_copies_of_one_cpu_s", ["e1*.txt"] * 10_000),
    ]:
        t = time.process_time()
        with contextlib.suppress(Exception):  # 10,000 copies name more than --max-files
            access.expand(patterns)
        out[label] = round(time.process_time() - t, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bomb-mb", type=int, default=3480)
    parser.add_argument("--memory-gb", type=float, default=3.0)
    parser.add_argument("--silent", type=int, default=24)
    parser.add_argument("--files", type=int, default=1100)
    parser.add_argument("--decompressed-mb", type=int, default=1024)
    parser.add_argument("--bombs", type=int, default=4, help="bomb requests sent at once")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        root = os.path.realpath(tmp)
        docs = stdlib_docstrings(300)
        corpus = write_bytes(os.path.join(root, "corpus.jsonl"), jsonl_bytes(docs))
        model = train_sentencepiece(docs, os.path.join(root, "spm"), vocab_size=1000)
        spec = PipelineSpec(
            source={"paths": [corpus]},
            tokenizer={"model": model},
            batch={"seq_len": 128, "size": 4},
            workers={"count": 0},
        )
        result = {
            "bomb": bomb(
                root, spec, args.bomb_mb, args.memory_gb, args.decompressed_mb, args.bombs
            ),
            "silent": silent(root, args.silent),
            "files": files(root, spec, docs, args.files),
            "globs": globs(root),
        }
    emit_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
