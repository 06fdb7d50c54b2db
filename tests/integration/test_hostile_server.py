"""The client trusts no server: a buggy or compromised one (a real gRPC server in the test that
sends crafted messages, a stand-in for what lies outside) gets its batches refused before the
training loop sees them, with a `StreamError` naming it, alone or as a member of a fan-in.

Before: messages were unlimited (one 800 MB batch OOM-killed a trainer), batches of another
shape or dtype reached the loop silently (float32 3.7 -> 3, int64 -2^40 -> 0), an "object"
dtype, overrunning segments or a non-UTF-8 state raised a raw ValueError / IndexError /
UnicodeDecodeError, and `get_state()` kept a server's 3 MiB or forged state as it came.
"""

from __future__ import annotations

import json
import time

import grpc
import numpy as np
import pytest

from input_client import InputClient, StreamError
from input_client._server_checks import expected_of
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION, compact_arrays, encode_tensors
from tests.support import serve_servicer

SIZE, SEQ_LEN = 4, 128


def batch(seq: int, size: int = SIZE, seq_len: int = SEQ_LEN, **arrays) -> pb.Batch:
    """A well-formed compact batch (every row one full segment), its arrays replaced by
    `arrays` (name -> ndarray, or a ready `pb.Tensor`)."""
    good = compact_arrays(
        np.ones((size, seq_len), np.int32),
        np.full(size, seq_len, np.int32),
        np.ones(size, np.int32),
        None,
    )
    msg = pb.Batch(sequence_number=seq, state=b'{"seq":%d}' % (seq + 1), num_tokens=size * seq_len)
    for name, a in {**good, **arrays}.items():
        if isinstance(a, pb.Tensor):
            msg.tensors.append(a)
        else:
            encode_tensors({name: a}, into=msg.tensors)
    return msg


class HostileServer(pb_grpc.InputServiceServicer):
    """Answers GetInfo as a server of this release, then streams `messages` as they are."""

    def __init__(self, messages):
        self.messages = messages
        self.streams = 0

    def GetInfo(self, request, context):
        return pb.GetInfoResponse(server_version="hostile", protocol_version=PROTOCOL_VERSION)

    def StreamBatches(self, requests, context):
        self.streams += 1
        next(requests)  # the stream's first request: the spec
        yield from self.messages
        while context.is_active():  # hold the stream open: the client must end it
            time.sleep(0.05)


def with_state(seq: int, state: bytes) -> pb.Batch:
    msg = batch(seq)
    msg.state = state
    return msg


def raw(name: str, dtype: str, shape, data: bytes) -> pb.Tensor:
    return pb.Tensor(name=name, dtype=dtype, shape=shape, data=data)


# Each crafted second batch, and what the refusal must say of it.
CRAFTED = {
    "shape_2x64": (lambda: batch(1, 2, 64), "`inputs` of shape [2, 64]; this stream's is [4, 128]"),
    "shape_9x4096": (
        lambda: batch(1, 9, 4096),
        "`inputs` of shape [9, 4096]; this stream's is [4, 128]",
    ),
    "float32_ids": (
        lambda: batch(1, inputs=np.full((SIZE, SEQ_LEN), 3.7, np.float32)),
        "`inputs` of dtype 'float32'",
    ),
    "int64_ids": (
        lambda: batch(1, inputs=np.full((SIZE, SEQ_LEN), -(2**40), np.int64)),
        "`inputs` of dtype 'int64'",
    ),
    "object_dtype": (
        lambda: batch(1, inputs=raw("inputs", "object", [SIZE, SEQ_LEN], b"\0" * 4096)),
        "`inputs` of dtype 'object'",
    ),
    "overrunning_segments": (
        lambda: batch(1, segment_lengths=np.array([200, 128, 128, 128], np.int32)),
        "row 0 whose segments hold 200 tokens, more than its 128",
    ),
    "segment_counts_past_lengths": (
        lambda: batch(1, segments_per_row=np.array([2, 1, 1, 1], np.int32)),
        "`segments_per_row` counting 5 segments for 4 `segment_lengths`",
    ),
    "bytes_short_of_shape": (
        lambda: batch(1, inputs=raw("inputs", "int32", [SIZE, SEQ_LEN], b"\0" * 12)),
        "`inputs` of 12 bytes for shape [4, 128]",
    ),
    "missing_tensor": (
        lambda: pb.Batch(sequence_number=1, tensors=batch(1).tensors[:1], state=b'{"seq":2}'),
        "the tensors ['inputs']",
    ),
    "non_utf8_state": (lambda: with_state(1, b'{"seq":2,"x":"\xff\xfe"}'), "not UTF-8 JSON"),
    "oversized_state": (
        lambda: with_state(1, json.dumps({"seq": 2, "pad": "x" * (100 << 10)}).encode()),
        "a resume state of 102",
    ),
    "forged_state_seq": (lambda: with_state(1, b'{"seq":99}'), "'seq' is 99, not 2"),
    "state_not_an_object": (lambda: with_state(1, b"[2]"), "not UTF-8 JSON of an object"),
}


@pytest.fixture
def spec(make_spec):
    s = make_spec()
    assert (s.batch.size, s.batch.seq_len) == (SIZE, SEQ_LEN)
    return s


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_batch_that_does_not_fit_the_spec_is_refused_naming_the_server(tmp_path, spec, case):
    make, words = CRAFTED[case]
    sock = f"unix://{tmp_path}/hostile.sock"
    with (
        serve_servicer(HostileServer([batch(0), make()]), sock),
        InputClient(sock, connect_timeout_s=10) as c,
        c.batches(spec, reconnect_deadline_s=30) as it,
    ):
        first = next(it)
        assert first["inputs"].shape == (SIZE, SEQ_LEN) and first["inputs"].dtype == np.int32
        start = time.monotonic()
        with pytest.raises(StreamError) as e:
            next(it)
        assert time.monotonic() - start < 5  # refused, not retried
        assert it.get_state() == {"seq": 1}  # the crafted batch's state was never kept
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert f"the server at {sock!r} sent batch 1" in e.value.details
    assert words in e.value.details, e.value.details
    assert len(e.value.details) < 600


def test_a_message_over_the_spec_sized_receive_limit_is_refused_before_reading_it(tmp_path, spec):
    """An "800 MB" batch: it claims [50000, 4096] int32 ids; it is sent only just over the
    limit (the limit, not its claim, is what keeps the client's memory)."""
    limit = expected_of(spec.to_proto()).receive_limit
    assert limit < 4 << 20  # 16 batches of [4, 128], their states and headroom
    huge = batch(1, inputs=raw("inputs", "int32", [50_000, 4096], b"\0" * (limit + 1)))
    sock = f"unix://{tmp_path}/hostile.sock"
    with (
        serve_servicer(HostileServer([batch(0), huge]), sock),
        InputClient(sock, connect_timeout_s=10) as c,
        c.batches(spec, reconnect_deadline_s=30) as it,
    ):
        next(it)
        start = time.monotonic()
        with pytest.raises(StreamError) as e:
            next(it)
        assert time.monotonic() - start < 5  # not retried: no retry cures it
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"the server at {sock!r} sent a message over this client's receive limit" in (
        e.value.details
    )
    assert f"of {limit} bytes" in e.value.details


def test_a_named_pipeline_is_checked_against_the_shape_the_server_gives_it(tmp_path):
    class Named(HostileServer):
        def GetInfo(self, request, context):
            shape = pb.PipelineSpec(batch=pb.BatchShape(size=SIZE, seq_len=SEQ_LEN))
            return pb.GetInfoResponse(protocol_version=PROTOCOL_VERSION, pipelines={"web": shape})

    sock = f"unix://{tmp_path}/hostile.sock"
    with (
        serve_servicer(Named([batch(0), batch(1, 2, 64)]), sock),
        InputClient(sock, connect_timeout_s=10) as c,
    ):
        with pytest.raises(StreamError) as missing:
            c.batches("other")
        with c.batches("web") as it:
            next(it)
            with pytest.raises(StreamError, match=r"`inputs` of shape \[2, 64\]"):
                next(it)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert "no pipeline 'other'" in missing.value.details and "known: web" in missing.value.details


@pytest.mark.parametrize("kind", ["over_the_limit", "float32_ids"])
def test_a_fan_in_names_the_member_that_sent_a_bad_batch(tmp_path, spec, kind):
    if kind == "over_the_limit":
        limit = expected_of(spec.to_proto()).receive_limit
        bad = batch(0, inputs=raw("inputs", "int32", [50_000, 4096], b"\0" * (limit + 1)))
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    else:
        bad = batch(0, inputs=np.full((SIZE, SEQ_LEN), 3.7, np.float32))
        code = grpc.StatusCode.DATA_LOSS
    good_sock, bad_sock = f"unix://{tmp_path}/good.sock", f"unix://{tmp_path}/bad.sock"
    with (
        serve_servicer(HostileServer([batch(0), batch(1)]), good_sock),
        serve_servicer(HostileServer([bad]), bad_sock),
        InputClient([good_sock, bad_sock], connect_timeout_s=10) as c,
        c.batches(spec, reconnect_deadline_s=30) as it,
    ):
        next(it)  # server 0's first batch; server 1's is next in round robin
        with pytest.raises(StreamError) as e:
            next(it)
    assert e.value.code == code
    assert e.value.details.startswith(f"server 1 of 2 ({bad_sock!r}): the server at {bad_sock!r}")


def test_a_state_larger_than_any_of_the_spec_is_refused_before_the_stream_opens(tmp_path, spec):
    """A server's own RESOURCE_EXHAUSTED for an oversized request must not be read as an
    oversized answer: the client never sends a state no server of this spec wrote."""
    sock = f"unix://{tmp_path}/hostile.sock"
    fake = HostileServer([batch(0)])
    with serve_servicer(fake, sock), InputClient(sock, connect_timeout_s=10) as c:
        with pytest.raises(ValueError, match="not a get_state.. result of this stream"):
            c.batches(spec, state={"seq": 1, "pad": "x" * (100 << 10)})
        with c.batches(spec, state={"seq": 0}) as it:  # a state of the spec's size is sent
            next(it)
    assert fake.streams == 1
