"""A fresh stream's wait for a place in the server's set-up queue: which refusals it waits
out (the queue's, in this release's words and the one's before; never a budget of the
request's own), its pauses (jittered, growing, within the deadline), its one warning."""

from __future__ import annotations

import logging

import grpc
import pytest

from input_client import _reconnect
from input_client._reconnect import BACKOFF_MAX_S, SETUP_WAIT_INITIAL_S, SetUpWait
from input_client.errors import StreamError

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
QUEUE_NOW = (
    "reading `resume_state`'s old hosts' states: the server's set-up queue is full (16 "
    "requests waiting to set up large resumed states, 16 of them from this peer and 0 from "
    "this client; places are shared fairly between peers, then between a peer's clients); "
    "retry later."
)
QUEUE_BEFORE = (
    "reading `resume_state`'s old hosts' states: 16 requests already wait to set up large "
    "resumed states, the most the server queues (16); retry later."
)


@pytest.mark.parametrize(
    "code, details, waits",
    [
        (EXHAUSTED, QUEUE_NOW, True),
        (EXHAUSTED, QUEUE_BEFORE, True),
        (
            EXHAUSTED,
            "reading `resume_state`'s old hosts' states took over 5 s of the server's CPU, the "
            "most a request's set-up may take: resume on fewer old hosts' states.",
            False,
        ),
        (
            EXHAUSTED,
            "the stream would hold up to 4,608 MiB (batch.size 512 x batch.seq_len 65536 x 24 "
            "bytes per token x 4 queued batches and more), over the server's "
            "--stream-memory-mb 256; lower `batch.size` or `batch.seq_len`, or ask the "
            "operator for a larger budget.",
            False,
        ),
        (EXHAUSTED, "the server already runs its maximum of 8 streams.", False),
        (grpc.StatusCode.UNAVAILABLE, QUEUE_NOW, False),
    ],
    ids=["queue-full", "queue-full-earlier-release", "cpu-budget", "memory-budget", "streams",
         "not-exhausted"],
)  # fmt: skip
def test_only_the_set_up_queue_refusal_is_waited_out(code, details, waits):
    assert SetUpWait.applies(StreamError(code, details)) is waits


def test_pauses_grow_jittered_within_the_deadline_then_the_refusal_is_raised(monkeypatch, caplog):
    now = [100.0]
    monkeypatch.setattr(_reconnect.time, "monotonic", lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="input_client"):
        wait = SetUpWait("unix:///s.sock", 30.0, StreamError(EXHAUSTED, QUEUE_NOW))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "waiting for a place in its set-up queue for up to 30 s" in said[0]
    pauses, delay = [], SETUP_WAIT_INITIAL_S
    while now[0] < 100.0 + 30.0:
        pause = wait.next_pause_s()
        assert min(delay * 0.5, 130.0 - now[0]) <= pause <= delay, (pause, delay)
        pauses.append(pause)
        delay = min(2 * delay, BACKOFF_MAX_S)
        now[0] += pause
    assert pauses[-1] <= BACKOFF_MAX_S and len(pauses) > 5
    with pytest.raises(StreamError) as e:
        wait.next_pause_s()
    assert e.value.code == EXHAUSTED
    assert QUEUE_NOW in e.value.details and "waited 30.0 s for a place" in e.value.details
    assert len(caplog.records) == 1  # said once
