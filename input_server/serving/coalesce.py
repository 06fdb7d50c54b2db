"""Coalescing: small batches share one gRPC message (`Batch.following`), each whole.

gRPC's Python streaming costs CPU per message on each side, mostly fixed, and more when
messages come at a pipeline's pace than back to back (docs/benchmarks.md, "Message size"). So
as many batches as fit MESSAGE_TOKENS (padding included) travel together, each with its own
sequence number and state; `serve --message-tokens` sets the size. A batch waits at most
COALESCE_WAIT_S for company, so a slow pipeline's batches still go one by one, promptly; and at
most MAX_BATCHES_PER_MESSAGE share a message, so tiny batches still flow (and show the
consumer's pace) message by message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from input_client.proto import pb
from input_client.wire import MAX_BATCHES_PER_MESSAGE, encode_tensors

MESSAGE_TOKENS = 1 << 18
COALESCE_WAIT_S = 0.02

# A queued batch: its message (sequence number, state; no tensors yet) and its wire arrays.
# The end marker has no arrays.
Queued = tuple[pb.Batch, Mapping[str, np.ndarray] | None]


def batches_per_message(batch_size: int, seq_len: int, message_tokens: int) -> int:
    """How many batches of this shape share a message: as many as fit `message_tokens`
    (padding included), at least one, at most MAX_BATCHES_PER_MESSAGE."""
    return max(1, min(MAX_BATCHES_PER_MESSAGE, message_tokens // (batch_size * seq_len)))


def coalesce(
    first: Queued,
    take: Callable[[float], Any],
    *,
    limit: int,
    wait_s: float = COALESCE_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[pb.Batch, Any]:
    """One message: `first` with the batches `take` gives within `wait_s`, `limit` in all.

    The tensors are added straight into the outgoing message (appending a finished message
    would copy its bytes).

    Args:
      first: a queued batch (not the end marker).
      take: `take(timeout_s)` gives the next queued item, or None when none came in time;
        anything but a queued batch (the end marker, an error) ends the message.
      limit: the most batches in the message.
      wait_s: how long the first batch waits for company.

    Returns:
      The message, and what was taken but not joined (the end marker, an error), if anything;
      it goes next, alone.
    """
    msg, arrays = first
    encode_tensors(arrays, into=msg.tensors)
    deadline = clock() + wait_s
    while len(msg.following) + 1 < limit:
        item = take(max(0.0, deadline - clock()))
        if item is None:
            break
        if not isinstance(item, tuple) or item[1] is None:
            return msg, item
        more, more_arrays = item
        joined = msg.following.add()
        joined.CopyFrom(more)  # no tensors yet: a few fields
        encode_tensors(more_arrays, into=joined.tensors)
    return msg, None
