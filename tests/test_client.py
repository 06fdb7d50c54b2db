"""The thin client: import isolation, jax placement with a Sharding, sequence checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import input_client
from input_client import InputClient
from input_client.proto import pb, pb_grpc
from input_client.wire import FIELDS, PROTOCOL_VERSION, encode_tensors
from input_server.batching.pack import PackedBatch


def test_public_names_import():
    for name in input_client.__all__:
        assert getattr(input_client, name) is not None


def test_client_streams_without_grain_sentencepiece_or_jax(server, make_spec):
    spec = make_spec()
    code = textwrap.dedent(f"""
        import json, sys
        from input_client import InputClient, PipelineSpec
        spec = PipelineSpec.from_dict(json.loads({json.dumps(json.dumps(spec.to_dict()))}))
        with InputClient({server.targets[0]!r}) as c, c.batches(spec) as it:
            n = sum(1 for _ in it)
        heavy = [m for m in ("grain", "sentencepiece", "jax") if m in sys.modules]
        print(json.dumps({{"batches": n, "heavy": heavy}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["batches"] > 10
    assert result["heavy"] == []


def test_sharding_places_global_jax_arrays(server, make_spec):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    assert len(devices) == 8, "conftest sets XLA_FLAGS for 8 CPU devices"
    mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    spec = make_spec(batch={"size": 8})
    with InputClient(server.targets[0]) as c:
        with c.batches(spec, sharding=sharding) as it:
            placed = next(it)
        with c.batches(spec) as it:
            plain = next(it)
    for k in FIELDS:
        assert isinstance(placed[k], jax.Array)
        assert placed[k].sharding == sharding
        assert placed[k].shape == (8, 128)
        np.testing.assert_array_equal(np.asarray(placed[k]), plain[k])
        # Each of the 4 data shards holds 2 rows, replicated over the model axis.
        assert {s.data.shape for s in placed[k].addressable_shards} == {(2, 128)}


class _MisnumberingServicer(pb_grpc.InputServiceServicer):
    """A server that sends the given sequence numbers: a stand-in for a broken or foreign one."""

    def __init__(self, seqs):
        self.seqs = seqs

    def GetInfo(self, request, context):
        return pb.GetInfoResponse(server_version="test", protocol_version=PROTOCOL_VERSION)

    def StreamBatches(self, request, context):
        batch = PackedBatch(np.ones((1, 4), np.int32), np.array([4], np.int32),
                            np.array([1], np.int32))
        for seq in self.seqs:
            yield pb.Batch(sequence_number=seq, tensors=encode_tensors(batch.compact()),
                           state=b'{"seq": %d}' % (seq + 1), num_tokens=4)


@pytest.mark.parametrize("seqs, words", [([0, 1, 3], "expected batch 2, got batch 3: a gap"),
                                         ([0, 1, 1], "expected batch 2, got batch 1: a repeat")],
                         ids=["gap", "repeat"])
def test_sequence_gap_or_repeat_raises(tmp_path, seqs, words):
    from concurrent import futures

    import grpc

    from input_client import SequenceError

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_InputServiceServicer_to_server(_MisnumberingServicer(seqs), server)
    server.add_insecure_port(f"unix://{tmp_path}/bad.sock")
    server.start()
    try:
        with InputClient(f"unix://{tmp_path}/bad.sock", connect_timeout_s=10) as c, \
                c.batches("any", reconnect_deadline_s=0) as it:
            next(it)
            next(it)
            with pytest.raises(SequenceError, match=words):
                next(it)
    finally:
        server.stop(None)


class _OtherProtocolServicer(pb_grpc.InputServiceServicer):
    """A server of another release: it speaks wire protocol `version` (0 = sends none)."""

    def __init__(self, version: int):
        self.version = version
        self.streams = 0

    def GetInfo(self, request, context):
        return pb.GetInfoResponse(server_version="0.0.1", protocol_version=self.version)

    def StreamBatches(self, request, context):
        self.streams += 1
        yield pb.Batch(sequence_number=0, end_of_data=True)


@pytest.mark.parametrize("version, words", [(0, "speaks wire protocol one from before"),
                                            (PROTOCOL_VERSION + 1, "speaks wire protocol "
                                             f"{PROTOCOL_VERSION + 1}; the client speaks "
                                             f"{PROTOCOL_VERSION}")], ids=["older", "newer"])
def test_server_of_another_wire_protocol_is_refused_before_streaming(tmp_path, version, words):
    from concurrent import futures

    import grpc

    from input_client import StreamError

    servicer = _OtherProtocolServicer(version)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_InputServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{tmp_path}/old.sock")
    server.start()
    try:
        with InputClient(f"unix://{tmp_path}/old.sock", connect_timeout_s=10) as c:
            with pytest.raises(StreamError) as e:
                c.batches("any")
            assert c.info().server_version == "0.0.1"  # info still answers, for diagnosis
    finally:
        server.stop(None)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert words in e.value.details and "input-server 0.0.1" in e.value.details
    assert servicer.streams == 0  # refused before any batch could be misread


def test_server_replaced_by_another_wire_protocol_while_reconnecting_is_refused(tmp_path,
                                                                              make_spec):
    from concurrent import futures

    import grpc

    from input_client import StreamError
    from input_server.serving.server import Server, ServerConfig

    sock = f"unix://{tmp_path}/s.sock"
    real = Server(ServerConfig(listen=[sock], grace_s=1))
    other = _OtherProtocolServicer(PROTOCOL_VERSION + 1)
    replacement = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_InputServiceServicer_to_server(other, replacement)
    try:
        with InputClient(sock) as client, \
                client.batches(make_spec(order={"epochs": 0}), prefetch=1,
                               reconnect_deadline_s=30) as it:
            next(it)
            real.stop()
            replacement.add_insecure_port(sock)
            replacement.start()
            with pytest.raises(StreamError) as e:
                for _ in range(10_000):  # what had arrived before the stop, then the refusal
                    next(it)
    finally:
        replacement.stop(None)
        real.stop(0)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"speaks wire protocol {PROTOCOL_VERSION + 1}" in e.value.details
    assert other.streams == 0  # no stream was opened on it
