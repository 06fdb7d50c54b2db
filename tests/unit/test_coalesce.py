"""Coalescing small batches into one message: the limit, the wait bound, what goes alone."""

from __future__ import annotations

import numpy as np

from input_client.proto import pb
from input_client.wire import decode_batch
from input_server.serving.coalesce import (
    MAX_BATCHES_PER_MESSAGE,
    batches_per_message,
    coalesce,
)


def queued(seq: int):
    arrays = {
        "inputs": np.full((2, 4), seq, np.int32),
        "segment_lengths": np.array([4, 4], np.int32),
        "segments_per_row": np.array([1, 1], np.int32),
    }
    return pb.Batch(sequence_number=seq, num_tokens=8), arrays


def takes(items):
    items = list(items)
    return lambda timeout: items.pop(0) if items else None


def test_batches_per_message_fits_the_tokens_and_the_cap():
    assert batches_per_message(4, 1024, 1 << 18) == MAX_BATCHES_PER_MESSAGE  # 64 would fit
    assert batches_per_message(32, 2048, 1 << 18) == 4
    assert batches_per_message(256, 8192, 1 << 18) == 1  # bigger than a message: alone


def test_joins_up_to_the_limit_in_order_each_batch_whole():
    msg, left = coalesce(queued(0), takes(queued(i) for i in range(1, 10)), limit=4)
    assert left is None
    batches = [msg, *msg.following]
    assert [b.sequence_number for b in batches] == [0, 1, 2, 3]
    for b in batches:
        assert int(decode_batch(b.tensors)["inputs"][0, 0]) == b.sequence_number


def test_the_end_marker_or_an_error_is_not_joined_but_handed_back():
    end = (pb.Batch(sequence_number=2, end_of_data=True), None)
    msg, left = coalesce(queued(0), takes([queued(1), end, queued(9)]), limit=8)
    assert [b.sequence_number for b in (msg, *msg.following)] == [0, 1] and left is end
    error = KeyError("x")
    msg, left = coalesce(queued(0), takes([error]), limit=8)
    assert not msg.following and left is error


def test_a_batch_waits_at_most_the_bound_for_company():
    now = [0.0]

    def take(timeout):
        now[0] += timeout  # nothing came within the time left
        return None

    msg, left = coalesce(queued(0), take, limit=8, wait_s=0.02, clock=lambda: now[0])
    assert not msg.following and left is None and now[0] <= 0.02 + 1e-9
