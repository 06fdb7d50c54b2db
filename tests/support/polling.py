"""Waiting for what a server shows: asked again until it holds, or failing at a deadline."""

from __future__ import annotations

import time


def consume_until(
    it, client, done, *, pace: float = 0.0, timeout: float = 40.0, into: list | None = None
):
    """Takes batches from `it` (at `pace` a second; 0 = as fast as they come) until
    `done(stream_info)` holds for the one stream the server runs, checked twice a second.

    An "auto" stream tunes only while its loop takes batches, so a test waiting for its
    tuning keeps taking them. Returns the last StreamInfo; the batches go into `into`.
    """
    deadline = time.monotonic() + timeout
    checked = 0.0
    while True:
        batch = next(it)
        if into is not None:
            into.append(batch)
        if pace:
            time.sleep(1 / pace)
        if time.monotonic() - checked >= 0.5:
            checked = time.monotonic()
            (stream,) = client.info().streams
            if done(stream):
                return stream
            assert checked < deadline, f"not reached in {timeout} s: {stream}"


def wait_for(check, what: str = "", timeout: float = 20.0):
    """`check()`'s first true value, asked every 0.1 s; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s: {what}"
        time.sleep(0.1)
    return value
