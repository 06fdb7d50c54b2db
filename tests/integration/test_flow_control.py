"""Flow control: the server runs at most `queue_depth + prefetch + one message's batches`
ahead of what the training loop has taken, and the demand it reports is the loop's pace.

Without it a server ran ~935 batches ahead of a loop taking 3 a second (gRPC's buffers), and
reported 234.6 batches/s for it."""

from __future__ import annotations

import time

import pytest

from input_client import InputClient
from input_server.serving.coalesce import MESSAGE_TOKENS, batches_per_message
from input_server.serving.server import Server, ServerConfig


@pytest.mark.parametrize("prefetch", [1, 4])
def test_the_server_runs_a_bounded_way_ahead_of_the_loop(tmp_path, make_spec, prefetch):
    spec = make_spec(order={"epochs": 0})
    depth = 3
    # What flow control allows: the client's window (prefetch + the batch in hand) less one,
    # plus one message; the server's queue holds batches produced, not sent. The issue's
    # bound adds `depth` to it.
    bound = prefetch + batches_per_message(spec.batch.size, spec.batch.seq_len, MESSAGE_TOKENS)
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], queue_depth=depth)) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec, prefetch=prefetch) as it,
    ):
        next(it)
        most_ahead = 0
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            next(it)
            time.sleep(0.02)  # the loop's step
            (stream,) = client.info().streams
            ahead = stream.batches_sent - it.batches_yielded
            most_ahead = max(most_ahead, ahead)
            assert ahead <= bound, (ahead, bound)
            assert stream.batches_taken <= it.batches_yielded
        assert most_ahead >= prefetch  # it did run ahead, as far as allowed


def test_the_reported_demand_is_the_loops_pace(tmp_path, make_spec):
    spec = make_spec(order={"epochs": 0})
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec, prefetch=2) as it,
    ):
        next(it)
        first = time.monotonic()
        taken = 0
        while time.monotonic() - first < 3.0:
            time.sleep(0.05)  # about 20 batches a second, as a trainer's step would
            next(it)
            taken += 1
        pace = taken / (time.monotonic() - first)
        (stream,) = client.info().streams
        assert abs(stream.consumed_batches_per_s - pace) <= 0.1 * pace, (
            stream.consumed_batches_per_s,
            pace,
        )
        # The count travels on the call's own requests, a moment after the loop took the
        # batch: it reaches the server's figure soon, and never runs past the loop.
        deadline = time.monotonic() + 5.0
        while stream.batches_taken != it.batches_yielded and time.monotonic() < deadline:
            assert stream.batches_taken < it.batches_yielded
            time.sleep(0.02)
            (stream,) = client.info().streams
        assert stream.batches_taken == it.batches_yielded


def test_a_client_that_sends_no_credit_gets_the_whole_stream(target, make_spec):
    """A raw caller that sends its one request and half-closes (a server-streaming call):
    nothing holds the stream back but gRPC."""
    from tests.support import raw_messages

    messages = raw_messages(target, make_spec())
    assert messages[-1].end_of_data
