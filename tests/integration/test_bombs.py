"""Decompression bombs: a compressed file inside the roots that expands past the server's
--max-decompressed-mb ends its own stream with RESOURCE_EXHAUSTED naming the file and the flag,
decompressed streaming (never whole), while other streams go on. The bombs are hundreds of MB
of repeated lines, built streaming (kilobytes on disk) and refused after a few MB, so nothing
large is ever allocated, even by a server that would decompress them whole."""

from __future__ import annotations

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
from input_server.data.jsonl import JsonlReader
from input_server.errors import CancelledError, OverBudgetError, RecordError
from input_server.serving.server import Server, ServerConfig
from tests.support import jsonl_bytes, write_bytes

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


def call(target: str, spec: pb.PipelineSpec, timeout: float = 60) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(target) as channel:
        stream = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
            timeout=timeout,
        )
        try:
            for _ in stream:
                pass
        except grpc.RpcError as e:
            return e.code(), e.details()
        return grpc.StatusCode.OK, ""


@pytest.fixture
def bounded(tmp_path):
    """A server whose sources' compressed files may expand to 4 MB in memory."""
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], max_decompressed_mb=4, grace_s=1)
    with Server(config) as srv:
        yield srv.targets[0]


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


def test_the_bound_is_for_the_source_s_compressed_files_together(
    bounded, make_spec, docs, tmp_path
):
    """Three 1.8 MB files fit one by one but not together: the third is refused, named."""
    import zstandard

    data = jsonl_bytes(docs) * 4  # ~1.8 MB: two fit in 4 MiB, three do not
    paths = [
        write_bytes(tmp_path / f"part{i}.jsonl.zst", zstandard.ZstdCompressor().compress(data))
        for i in range(3)
    ]
    assert 1 << 20 < len(data) < 2 << 20
    spec = make_spec(source={"paths": [os.path.relpath(p) for p in paths]})
    code, details = call(bounded, spec.to_proto())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "part2.jsonl.zst" in details and "in the files before it" in details, details
    code, details = call(
        bounded, make_spec(source={"paths": [os.path.relpath(paths[0])]}).to_proto()
    )
    assert code == grpc.StatusCode.OK, details


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
