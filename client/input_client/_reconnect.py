"""Reconnecting a broken stream: which failures a new stream can cure, backoff, one outage."""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any

import grpc

from input_client.errors import ReconnectError, StreamError
from input_client.proto import pb
from input_client.wire import PROTOCOL_VERSION, SETUP_QUEUE_FULL, protocol_mismatch

log = logging.getLogger("input_client.iterator")

# gRPC redials a lost server with its own backoff, up to 120 s between tries by default: a
# server restarted on the same address would then wait that long to be noticed.
# The unary calls (GetInfo, which every `batches()` asks first, and DescribeTokenizer) are
# retried by gRPC itself when the server refuses them for its caps on calls at once
# (RESOURCE_EXHAUSTED, "retry shortly": `input_server/serving/call_limits.py`): many trainers
# starting together are a burst, not an error. At most 5 attempts over about 1.5 s (gRPC
# caps maxAttempts at 5), jittered by gRPC.
_UNARY_RETRY = {
    "methodConfig": [
        {
            "name": [
                {"service": "input_server.v1.InputService", "method": "GetInfo"},
                {"service": "input_server.v1.InputService", "method": "DescribeTokenizer"},
            ],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.1s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
            },
        }
    ]
}
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(_UNARY_RETRY)),
]
# The server closes a connection idle for 60 s (`input_server/serving/server.py` IDLE_S) with
# a GOAWAY, which gRPC's core logs as an INFO line in the trainer's process, once per idle
# channel (the GetInfo channel; a stream's channel between eval streams). The client closes
# its own idle connections first, quietly, at half the server's limit; a call (never a
# running stream, which is not idle) reconnects at once. Read when each channel is opened.
IDLE_S = 30.0


def channel_options() -> list[tuple[str, Any]]:
    """Every client channel's reconnect, retry and idle options."""
    return [*RECONNECT_OPTIONS, ("grpc.client_idle_timeout_ms", int(IDLE_S * 1000))]


# Failures a new stream from the last state can cure: the server went away, restarted or is
# draining (UNAVAILABLE; also what gRPC reports for a reset connection). Everything else is an
# answer about the request or the data (INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS), or a server
# failure a retry would repeat (INTERNAL: an unexpected exception, a dead worker process).
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
# While reconnecting, a full server is retried too: the broken stream's slot may not be free yet.
RETRYABLE_WHILE_RECONNECTING = RETRYABLE | {grpc.StatusCode.RESOURCE_EXHAUSTED}
# Backoff between reconnect attempts: exponential from 0.1 s, at most 5 s, with jitter so that
# many clients of one restarted server do not retry in step.
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 5.0
# A fresh stream refused because the server's set-up queue is full (others' resumed states
# being read, each for seconds) waits for a place: a pause that doubles up to BACKOFF_MAX_S,
# jittered so that the clients refused together do not come back together. It starts longer
# than a reconnect's: a place frees only as a turn ends. Servers of an earlier release said
# it in the second words.
SETUP_WAIT_INITIAL_S = 0.5
SETUP_QUEUE_WORDS = (SETUP_QUEUE_FULL, "requests already wait to set up large resumed states")


def check_protocol(info: pb.GetInfoResponse, address: str) -> None:
    """Raises `StreamError` (FAILED_PRECONDITION) if the server speaks another wire protocol:
    its batches would be misread (or stop with a `SequenceError`)."""
    refusal = protocol_mismatch(
        f"the server at {address!r} (input-server {info.server_version or 'unknown'})",
        info.protocol_version,
        PROTOCOL_VERSION,
    )
    if refusal:
        raise StreamError(grpc.StatusCode.FAILED_PRECONDITION, refusal)


class Outage:
    """One break of a stream, from the failure until a new stream delivers again.

    Args:
      address: the server's address, for messages.
      deadline_s: how long to keep trying.
      error: the failure that broke the stream.
    """

    def __init__(self, address: str, deadline_s: float, error: StreamError):
        self.address = address
        self.deadline_s = deadline_s
        self.error = error
        self.start = time.monotonic()
        self.attempts = 0
        self._delay = BACKOFF_INITIAL_S
        log.warning(
            "input stream to %s broke (%s: %s); reconnecting for up to %g s",
            address,
            error.code.name,
            error.details,
            deadline_s,
        )

    @staticmethod
    def retryable(error: StreamError, *, reconnecting: bool) -> bool:
        return error.code in (RETRYABLE_WHILE_RECONNECTING if reconnecting else RETRYABLE)

    def remaining_s(self) -> float:
        return self.start + self.deadline_s - time.monotonic()

    def next_pause_s(self) -> float:
        """How long to wait before the next attempt (jittered, doubling, within the deadline).

        Raises:
          ReconnectError: the deadline has passed.
        """
        remaining = self.remaining_s()
        if remaining <= 0:
            raise ReconnectError(
                self.error.code,
                self.error.details,
                address=self.address,
                waited_s=time.monotonic() - self.start,
                attempts=self.attempts,
                deadline_s=self.deadline_s,
            )
        pause = min(remaining, self._delay * random.uniform(0.5, 1.0))
        self._delay = min(2 * self._delay, BACKOFF_MAX_S)
        return pause

    def ended(self, seq: int) -> None:
        """Logs the stream delivering again, from batch `seq`."""
        log.warning(
            "input stream to %s resumed at batch %d after %.1f s (%d attempt%s)",
            self.address,
            seq,
            time.monotonic() - self.start,
            self.attempts,
            "" if self.attempts == 1 else "s",
        )


class SetUpWait:
    """A fresh stream's wait for a place in the server's set-up queue, from its first refusal
    until a new stream is let in; said once when it begins.

    Args:
      address: the server's address, for messages.
      deadline_s: how long to keep trying (the client's `connect_timeout_s`).
      error: the refusal.
    """

    def __init__(self, address: str, deadline_s: float, error: StreamError):
        self.address = address
        self.deadline_s = deadline_s
        self.error = error
        self.start = time.monotonic()
        self._delay = SETUP_WAIT_INITIAL_S
        log.warning(
            "input stream to %s: the server is busy setting up other clients' resumed states "
            "(%s); waiting for a place in its set-up queue for up to %g s",
            address,
            error.details,
            deadline_s,
        )

    @staticmethod
    def applies(error: StreamError) -> bool:
        """Whether `error` is the server's set-up queue refusing the stream for now (not a
        budget the request itself is over, which no retry cures)."""
        return error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
            words in (error.details or "") for words in SETUP_QUEUE_WORDS
        )

    def next_pause_s(self) -> float:
        """How long to wait before the next try (jittered, doubling, within the deadline).

        Raises:
          StreamError: the last refusal, once the deadline has passed.
        """
        remaining = self.start + self.deadline_s - time.monotonic()
        if remaining <= 0:
            raise StreamError(
                self.error.code,
                f"{self.error.details} (waited {time.monotonic() - self.start:.1f} s for a "
                f"place in the server's set-up queue, the client's connect_timeout_s)",
            )
        pause = min(remaining, self._delay * random.uniform(0.5, 1.0))
        self._delay = min(2 * self._delay, BACKOFF_MAX_S)
        return pause
