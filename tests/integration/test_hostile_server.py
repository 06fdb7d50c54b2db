"""The client trusts no server: a buggy or compromised one (a real gRPC server in the test that
sends crafted messages, a stand-in for what lies outside) gets its batches refused before the
training loop sees them, with a `StreamError` naming it, alone or as a member of a fan-in.

Before: messages were unlimited (one 800 MB batch OOM-killed a trainer), batches of another
shape or dtype reached the loop silently (float32 3.7 -> 3, int64 -2^40 -> 0), an "object"
dtype, overrunning segments or a non-UTF-8 state raised a raw ValueError / IndexError /
UnicodeDecodeError, and `get_state()` kept a server's 3 MiB or forged state as it came.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from input_client import InputClient, StreamError
from input_client._server_checks import expected_of
from input_client.proto import pb
from input_client.wire import PROTOCOL_VERSION
from input_server.testing.attacks import CRAFTED, SEQ_LEN, SIZE, HostileServer, batch, raw
from tests.support import serve_servicer

# A refusal comes at once, well before a reconnect would give up: the bound holds on a loaded
# host (a few seconds' stall), and a client that retried until its deadline still fails it.
RECONNECT_S = 60
AT_ONCE_S = 15


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
        c.batches(spec, reconnect_deadline_s=RECONNECT_S) as it,
    ):
        first = next(it)
        assert first["inputs"].shape == (SIZE, SEQ_LEN) and first["inputs"].dtype == np.int32
        start = time.monotonic()
        with pytest.raises(StreamError) as e:
            next(it)
        assert time.monotonic() - start < AT_ONCE_S  # refused, not retried
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
        c.batches(spec, reconnect_deadline_s=RECONNECT_S) as it,
    ):
        next(it)
        start = time.monotonic()
        with pytest.raises(StreamError) as e:
            next(it)
        assert time.monotonic() - start < AT_ONCE_S  # not retried: no retry cures it
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
        c.batches(spec, reconnect_deadline_s=RECONNECT_S) as it,
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
