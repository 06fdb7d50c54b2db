"""Flow control: a stream sends only as far ahead of the training loop as the client allows.

gRPC's own flow control counts bytes in buffers that grow with the connection's measured
bandwidth: with it alone, a server ran ~935 batches ahead of a loop taking 3 a second, so
neither the server's queue nor the client's prefetch bounded anything, and the rate the
server saw was its own, not the loop's. Here the client's later requests report how many
batches its loop has taken (`batches_taken`), and the server sends while the batches sent
but not taken are fewer than the client's `window`. The rate of those reports is the loop's
real demand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from input_client.proto import pb
from input_server.errors import InvalidSpecError, RefusedError


class Credit:
    """What one stream's client has taken, and so how much more it may be sent.

    Args:
      window: batches the client may hold untaken (0 = no limit: a client that sends no
        credit).
    """

    def __init__(self, window: int):
        self.window = window
        self.taken = 0
        self.open_ended = window <= 0  # no credit will come: send as gRPC allows
        # Batches the server has handed to gRPC, the message in flight included: a loop cannot
        # have taken more, so a report above it is a lie that would end flow control.
        self.offered = 0
        self.failure: InvalidSpecError | None = None  # a report that broke the contract
        self._first: tuple[float, int] | None = None  # (time, taken) of the first report
        self._last: tuple[float, int] | None = None
        self._cond = threading.Condition()

    def offer(self, sent: int) -> None:
        """The stream is about to hand gRPC the message that brings it to `sent` batches."""
        with self._cond:
            self.offered = max(self.offered, sent)

    def grant(self, taken: int) -> None:
        """The client's loop has taken `taken` batches of this stream in all.

        A count above what the stream has offered is refused: the stream then ends with
        INVALID_ARGUMENT (`failure`), since its flow control and its demand would both be
        the client's invention.
        """
        now = time.monotonic()
        with self._cond:
            if taken <= self.taken:
                return
            if taken > self.offered:
                self._fail(
                    f"`batches_taken` {taken} in a credit report is more than the "
                    f"{self.offered} batches this stream has sent."
                )
                return
            self.taken = taken
            if self._first is None:
                self._first = (now, taken)
            self._last = (now, taken)
            self._cond.notify_all()

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = InvalidSpecError(message)
        self._cond.notify_all()

    def end(self) -> None:
        """No more reports will come (the client half-closed): nothing holds the stream back."""
        with self._cond:
            self.open_ended = True
            self._cond.notify_all()

    def allows(self, sent: int, timeout: float) -> bool:
        """Whether one more message may go after `sent` batches; waits up to `timeout`."""
        with self._cond:
            if not self._ahead(sent):
                return True
            self._cond.wait(timeout)
            return not self._ahead(sent)

    def check(self) -> None:
        """Raises the contract error of a bad credit report, if the client sent one."""
        if self.failure is not None:
            raise self.failure

    def _ahead(self, sent: int) -> bool:
        return self.failure is None and not self.open_ended and sent - self.taken >= self.window

    def taken_or(self, sent: int) -> int:
        """The batches the loop has taken: its reports, or for a client that sends none,
        `sent` (what gRPC let the server send)."""
        return self.taken if self.window > 0 else sent

    def taken_per_s(self) -> float | None:
        """Batches the loop took per second between its first and latest report; None before
        two reports (or for a client that sends none)."""
        with self._cond:
            if self._first is None or self._last is None or self._last[0] <= self._first[0]:
                return None
            return (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])

    def follow(self, requests: Iterator[Any]) -> None:
        """Reads the client's later requests on a thread of its own, until the stream ends."""

        def read() -> None:
            try:
                for raw in requests:
                    try:
                        msg = (
                            raw
                            if not isinstance(raw, bytes)
                            else pb.StreamBatchesRequest.FromString(raw)
                        )
                    except DecodeError as e:
                        with self._cond:
                            self._fail(
                                f"a credit report is not a valid StreamBatchesRequest ({e})."
                            )
                        return
                    self.grant(msg.batches_taken)
            except Exception:  # noqa: BLE001 - the call ended (cancelled, deadline)
                pass  # the stream's own end (or the sender's next wait) decides what follows
            self.end()

        threading.Thread(target=read, name="stream-credit", daemon=True).start()


# How often a stream waiting for the client's credit checks for cancellation and draining.
CREDIT_WAIT_S = 0.1


def _draining_refusal() -> RefusedError:
    return RefusedError(
        grpc.StatusCode.UNAVAILABLE, "the server is shutting down; resume from the last state."
    )


def send_with_credit(
    session, context: grpc.ServicerContext, credit: Credit, draining: threading.Event
) -> Iterator:
    """A session's messages as the client's credit allows them (`Credit`), ending when the
    client leaves, refusing with UNAVAILABLE once the server drains; counts what was sent on
    `session`."""
    for msg, error in session:
        if draining.is_set():
            raise _draining_refusal()
        if error is not None:
            if not isinstance(error, Exception):  # e.g. SystemExit from a library
                raise RuntimeError(f"{type(error).__name__}: {error}") from error
            raise error
        if msg is None:
            if not context.is_active():
                return
            credit.check()
            continue
        while not credit.allows(session.batches_sent, CREDIT_WAIT_S):
            if draining.is_set():
                raise _draining_refusal()
            if not context.is_active():
                return
        credit.check()  # a report that broke the contract ends the stream here
        credit.offer(session.batches_sent + 1 + len(msg.following))
        yield msg
        session.batches_sent += 1 + len(msg.following)
        if session.first_sent_s is None:
            session.first_sent_s = time.monotonic()
            session.first_message_batches = session.batches_sent
