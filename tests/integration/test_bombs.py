"""Decompression bombs: a compressed file inside the roots that expands past the server's
--max-decompressed-mb (one budget for all the process holds decompressed, every stream and
source together) ends its own stream with RESOURCE_EXHAUSTED naming the file and the flag,
decompressed streaming (never whole), while other streams go on. The bombs are hundreds of MB
of repeated lines, built streaming (kilobytes on disk) and refused after a few MB, so nothing
large is ever allocated, even by a server that would decompress them whole."""

from __future__ import annotations

import gc
import gzip
import os
import threading
import time
import tracemalloc

import grpc
import pytest

from input_client import InputClient
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION
from input_server import cancel
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline
from input_server.data import jsonl
from input_server.data.jsonl import JsonlReader
from input_server.data.records import DECOMPRESSED
from input_server.data.roots import DataAccess
from input_server.errors import CancelledError, OverBudgetError, RecordError
from input_server.serving.server import Server, ServerConfig
from tests.support import jsonl_bytes, stream_status, write_bytes

_LINE = b'{"text": "' + b"all work and no play " * 48 + b'"}\n'  # ~1 KB


def zstd_bomb(path, mb: int) -> str:
    """`mb` MB of one repeated JSON line, as zstd: a few KB, compressed 1 MB at a time."""
    import zstandard

    chunk = _LINE * ((1 << 20) // len(_LINE))
    c = zstandard.ZstdCompressor(level=3).compressobj()
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(c.compress(chunk))
        f.write(c.flush())
    return str(path)


def gzip_bomb(path, mb: int) -> str:
    chunk = _LINE * ((1 << 20) // len(_LINE))
    with gzip.open(path, "wb", compresslevel=6) as f:
        for _ in range(mb):
            f.write(chunk)
    return str(path)


def call(target: str, spec: pb.PipelineSpec) -> tuple[grpc.StatusCode, str]:
    """(status, details) of a raw request read to its end."""
    return stream_status(target, spec)[:2]


def serve(tmp_path, mb: float):
    gc.collect()  # earlier tests' readers give their bytes back to the process's budget
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], max_decompressed_mb=mb, grace_s=1)
    return Server(config)


@pytest.fixture
def bounded(tmp_path):
    """A server that may hold 4 MB of compressed files decompressed, all streams together."""
    with serve(tmp_path, 4) as srv:
        yield srv.targets[0]


def settled(held: int, timeout: float = 10.0) -> int:
    """The process's decompressed bytes once they come back to `held` (a stream's teardown
    runs in its server thread), or what they are at the deadline."""
    deadline = time.monotonic() + timeout
    while DECOMPRESSED.held != held and time.monotonic() < deadline:
        time.sleep(0.02)
    return DECOMPRESSED.held


@pytest.mark.parametrize("kind", ["zst", "gz"])
def test_a_bomb_is_resource_exhausted_naming_file_and_flag_while_another_stream_flows(
    kind, bounded, make_spec, tmp_path
):
    bomb = (
        zstd_bomb(tmp_path / "bomb.jsonl.zst", 256)
        if kind == "zst"
        else gzip_bomb(tmp_path / "bomb.jsonl.gz", 64)
    )
    assert os.path.getsize(bomb) < 1 << 20  # small on disk, 64-256 MB decompressed
    # Another client's stream, flowing before, during and after the bomb.
    taken, errors = [], []
    stop = threading.Event()

    def other() -> None:
        try:
            with InputClient(bounded, connect_timeout_s=10) as c:
                for _ in c.batches(make_spec(order={"epochs": 0})):
                    taken.append(time.monotonic())
                    if stop.is_set():
                        return
                    time.sleep(0.01)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not taken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert taken, errors
    written = os.path.relpath(bomb)  # as the client writes it: relative to the data root
    started = time.monotonic()
    code, details = call(bounded, make_spec(source={"paths": [written]}).to_proto())
    refused_at = time.monotonic()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert written in details and "--max-decompressed-mb 4" in details, details
    assert refused_at - started < 10
    n = len(taken)
    time.sleep(1.0)
    stop.set()
    thread.join(30)
    assert not errors, errors
    assert len(taken) > n, "the other stream stopped when the bomb was refused"
    assert any(started <= t <= refused_at + 1.0 for t in taken)


def parts(docs, tmp_path, n: int = 3) -> list[str]:
    """`n` .jsonl.zst files of ~1.8 MB decompressed each: two fit in 4 MiB, three do not."""
    import zstandard

    data = jsonl_bytes(docs) * 4
    assert 1 << 20 < len(data) < 2 << 20
    blob = zstandard.ZstdCompressor().compress(data)
    return [write_bytes(tmp_path / f"part{i}.jsonl.zst", blob) for i in range(n)]


def test_the_bound_is_for_the_source_s_compressed_files_together(
    bounded, make_spec, docs, tmp_path
):
    """Three 1.8 MB files fit one by one but not together: the third is refused, named."""
    paths = parts(docs, tmp_path)
    spec = make_spec(source={"paths": [os.path.relpath(p) for p in paths]})
    code, details = call(bounded, spec.to_proto())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "part2.jsonl.zst" in details and "held now" in details, details
    code, details = call(
        bounded, make_spec(source={"paths": [os.path.relpath(paths[0])]}).to_proto()
    )
    assert code == grpc.StatusCode.OK, details


def open_stream(target: str, spec: pb.PipelineSpec):
    """A stream that has sent its first batch (its files decompressed), and its channel."""
    channel = grpc.insecure_channel(target)
    call = pb_grpc.InputServiceStub(channel).StreamBatches(
        iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
        timeout=120,
    )
    next(call)
    return channel, call


def test_the_bound_is_one_budget_for_every_stream_of_the_server(bounded, make_spec, docs, tmp_path):
    """Two open streams of one 1.8 MB file each hold 3.6 of the 4 MB: a third stream's file is
    refused, naming the file and the flag; once they end, their bytes are back and it flows."""
    paths = [os.path.relpath(p) for p in parts(docs, tmp_path)]
    idle = DECOMPRESSED.held
    spec = [make_spec(source={"paths": [p]}, order={"epochs": 0}).to_proto() for p in paths]
    streams = [open_stream(bounded, s) for s in spec[:2]]
    try:
        assert DECOMPRESSED.held > idle + (3 << 20)
        code, details = call(bounded, spec[2])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert paths[2] in details and "--max-decompressed-mb 4" in details, details
        assert "held now" in details, details
    finally:
        for channel, stream in streams:
            stream.cancel()
            channel.close()
    assert settled(idle) == idle  # a request's pipeline gives its text back when it ends
    channel, stream = open_stream(bounded, spec[2])
    stream.cancel()
    channel.close()
    assert settled(idle) == idle


def test_concurrent_bombs_are_each_refused_within_one_bound_while_another_stream_flows(
    make_spec, docs, tmp_path
):
    """Four bombs at once against a server of an 8 MB bound: each refused, naming its file and
    the flag; the process never holds more than the bound decompressed (before: each stream
    had the whole bound, so four held four times it); another stream over a compressed file
    flows throughout and keeps its bytes."""
    import zstandard

    small = write_bytes(
        tmp_path / "small.jsonl.zst", zstandard.ZstdCompressor().compress(jsonl_bytes(docs))
    )
    bombs = [os.path.relpath(zstd_bomb(tmp_path / f"bomb{i}.jsonl.zst", 128)) for i in range(4)]
    with serve(tmp_path, 8) as srv:
        target = srv.targets[0]
        idle = DECOMPRESSED.held
        channel, other = open_stream(
            target,
            make_spec(source={"paths": [os.path.relpath(small)]}, order={"epochs": 0}).to_proto(),
        )
        try:
            holding = DECOMPRESSED.held
            assert holding > idle
            peak, done = [holding], threading.Event()

            def watch() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], DECOMPRESSED.held)
                    time.sleep(0.0005)

            results: dict[str, tuple[grpc.StatusCode, str]] = {}

            def bomb(path: str) -> None:
                results[path] = call(target, make_spec(source={"paths": [path]}).to_proto())

            threads = [threading.Thread(target=watch, daemon=True)]
            threads += [threading.Thread(target=bomb, args=(b,), daemon=True) for b in bombs]
            for t in threads:
                t.start()
            taken = 0
            while any(t.is_alive() for t in threads[1:]):
                next(other)  # the other stream flows while the bombs are refused
                taken += 1
                time.sleep(0.005)
            done.set()
            for t in threads:
                t.join(30)
            for path in bombs:
                code, details = results[path]
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (path, code, details)
                assert path in details and "--max-decompressed-mb 8" in details, details
            assert peak[0] <= idle + (8 << 20), f"held {peak[0] / (1 << 20):.1f} MB at once"
            assert settled(holding) == holding  # the refused gave theirs back, the other kept
            for _ in range(3):
                next(other)
            assert taken > 0
        finally:
            other.cancel()
            channel.close()
        assert settled(idle) == idle


def test_streams_one_after_another_on_one_pipeline_decompress_once(
    make_spec, docs, tmp_path, monkeypatch
):
    """A tuning's candidates and a named pipeline's clients open streams one after another on
    one Pipeline: the last stream closing gives back descriptors only; the text (and its share
    of the budget) stays until the pipeline is closed."""
    import zstandard

    path = write_bytes(
        tmp_path / "d.jsonl.zst", zstandard.ZstdCompressor().compress(jsonl_bytes(docs))
    )
    runs = []
    real = jsonl._zstd_chunks

    def counted(f):
        runs.append(1)
        return real(f)

    monkeypatch.setattr(jsonl, "_zstd_chunks", counted)
    gc.collect()
    idle = DECOMPRESSED.held
    access = DataAccess(max_decompressed_bytes=64 << 20)
    pipeline = Pipeline(make_spec(source={"paths": [path]}), access)
    held = DECOMPRESSED.held
    assert held - idle == len(jsonl_bytes(docs)) and runs == [1]
    for _ in range(2):
        with pipeline.stream(None, parallelism=Parallelism.fixed(0)) as stream:
            for _, _batch in zip(range(3), stream, strict=False):
                pass
        assert DECOMPRESSED.held == held
    assert runs == [1], f"decompressed {len(runs)} times"
    pipeline.close()
    assert DECOMPRESSED.held == idle


def test_decompression_is_streaming_and_bounded_in_memory(tmp_path):
    """Refused after about the bound (4 MB), not after decompressing 256 MB whole."""
    bomb = zstd_bomb(tmp_path / "b.jsonl.zst", 256)
    tracemalloc.start()
    try:
        with pytest.raises(OverBudgetError, match="--max-decompressed-mb 4"):
            JsonlReader(bomb, "text", max_decompressed=4 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, f"peak {peak >> 20} MB"


def test_a_client_that_leaves_stops_the_decompression(tmp_path):
    """With no bound, the 256 MB bomb is cut short by cancellation within 16 MB."""
    bomb = zstd_bomb(tmp_path / "b.jsonl.zst", 256)
    left = threading.Event()
    left.set()
    tracemalloc.start()
    try:
        with cancel.scope(left), pytest.raises(CancelledError):
            JsonlReader(bomb, "text")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak >> 20} MB"


def test_a_file_cut_inside_a_later_frame_is_still_a_record_error(docs, tmp_path):
    import zstandard

    c = zstandard.ZstdCompressor()
    data = jsonl_bytes(docs[:50])
    blob = c.compress(data) + c.compress(data)[:-7]
    path = write_bytes(tmp_path / "cut.jsonl.zst", blob)
    with pytest.raises(RecordError, match="cannot decompress.*inside a zstd frame"):
        JsonlReader(path, "text")
    whole = write_bytes(tmp_path / "whole.jsonl.zst", c.compress(data) + c.compress(data))
    assert len(JsonlReader(whole, "text")) == 100
