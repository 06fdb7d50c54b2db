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

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.message import DecodeError

from input_client.proto import pb
from input_server.errors import InvalidSpecError


class Credit:
    """What one stream's client has taken, and so how much more it may be sent.

    Args:
      window: batches the client may hold untaken (0 = no limit: a client that sends no
        credit).
      on_fail: called when a report breaks the contract (`failure`), so that a stream waiting
        for its next batch, not for credit, hears of it at once.
    """

    def __init__(self, window: int, on_fail: Callable[[], None] = lambda: None):
        self.window = window
        self._on_fail = on_fail
        self.taken = 0
        self.open_ended = window <= 0  # no credit will come: send as gRPC allows
        # Batches the server has handed to gRPC, the message in flight included: a loop cannot
        # have taken more, so a report above it is a lie that would end flow control.
        self.offered = 0
        self.sent = 0  # batches gRPC took from the stream
        self._first_sent: tuple[float, int] | None = None  # (time, sent) at the first message
        self.failure: InvalidSpecError | None = None  # a report that broke the contract
        # (time, taken, the trainer's data wait so far) of the first report and the latest
        self._first: tuple[float, int, float] | None = None
        self._last: tuple[float, int, float] | None = None
        self._wait_reported = False  # a report said the trainer waited (a client that says)
        self._cond = threading.Condition()
        self._woken = False  # `wake` came while no sender waited: its next wait returns at once

    def offer(self, sent: int) -> None:
        """The stream is about to hand gRPC the message that brings it to `sent` batches."""
        with self._cond:
            self.offered = max(self.offered, sent)

    def grant(self, taken: int, data_wait_s: float = 0.0) -> None:
        """The client's loop has taken `taken` batches of this stream in all, having waited
        `data_wait_s` seconds for them (0 from a client that does not say).

        A count above what the stream has offered is refused: the stream then ends with
        INVALID_ARGUMENT (`failure`), since its flow control and its demand would both be
        the client's invention.
        """
        now = time.monotonic()
        with self._cond:
            if not math.isfinite(data_wait_s) or data_wait_s < 0:
                self._fail(
                    f"`data_wait_s` {data_wait_s!r} in a credit report is not a finite number "
                    f"of seconds >= 0."
                )
                return
            if taken <= self.taken:
                return
            if taken > self.offered:
                self._fail(
                    f"`batches_taken` {taken} in a credit report is more than the "
                    f"{self.offered} batches this stream has sent."
                )
                return
            self.taken = taken
            wait = max(data_wait_s, self._last[2]) if self._last else data_wait_s
            self._wait_reported = self._wait_reported or wait > 0
            if self._first is None:
                self._first = (now, taken, wait)
            self._last = (now, taken, wait)
            self._cond.notify_all()

    def latest_report(self) -> tuple[float, int, float] | None:
        """(monotonic time, batches taken, the trainer's wait so far) of the latest report."""
        with self._cond:
            return self._last

    def exposed_wait(self) -> tuple[float, float]:
        """The trainer's exposed data wait its client reported: seconds in all, and their share
        of the loop's time between its first and latest report; (-1, -1) from a client that
        does not report it (or a trainer that never waited, which a prefetching client's first
        batch rules out)."""
        with self._cond:
            if not self._wait_reported or self._first is None or self._last is None:
                return -1.0, -1.0
            span = self._last[0] - self._first[0]
            share = (self._last[2] - self._first[2]) / span if span > 0 else 0.0
            return self._last[2], min(1.0, max(0.0, share))

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = InvalidSpecError(message)
        self._cond.notify_all()
        self._on_fail()

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
            if self._woken:  # a wake that came before this wait: the caller looks again now
                self._woken = False
                return False
            self._cond.wait(timeout)
            self._woken = False
            return not self._ahead(sent)

    def check(self) -> None:
        """Raises the contract error of a bad credit report, if the client sent one."""
        if self.failure is not None:
            raise self.failure

    def _ahead(self, sent: int) -> bool:
        return self.failure is None and not self.open_ended and sent - self.taken >= self.window

    def wake(self) -> None:
        """Wakes a sender waiting in `allows` (the client left: it need not wait its turn),
        or, between two waits, makes its next wait return at once."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def sent_message(self, batches: int) -> None:
        """gRPC took a message of `batches` batches."""
        with self._cond:
            self.sent += batches
            if self._first_sent is None:
                self._first_sent = (time.monotonic(), self.sent)

    def taken_so_far(self) -> int:
        """The batches the loop has taken: its reports, or for a client that sends none,
        what gRPC let the server send."""
        return self.taken if self.window > 0 else self.sent

    def pace(self) -> float:
        """The loop's pace, batches/s: between its first and latest report; before two
        reports (or for a client that sends none), what it took since the first message,
        once fed (that message's batches came before the clock started)."""
        with self._cond:
            if self._first is not None and self._last is not None:
                if self._last[0] > self._first[0]:
                    return (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
            if self._first_sent is None or self.sent <= self._first_sent[1]:
                return 0.0
            at, first = self._first_sent
            return (self.sent - first) / max(time.monotonic() - at, 1e-9)

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
                    self.grant(msg.batches_taken, msg.data_wait_s)
            except Exception:  # noqa: BLE001 - the call ended (cancelled, deadline)
                pass  # the stream's own end (or the sender's next wait) decides what follows
            self.end()

        threading.Thread(target=read, name="stream-credit", daemon=True).start()
