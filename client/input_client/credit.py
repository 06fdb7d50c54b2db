"""Flow control, the client's side: what the training loop has taken of a stream, reported to
the server as the credit that lets it send more (the server's side: `serving/credit.py`)."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Iterator

from input_client.proto import pb


class Taken:
    """What the loop has taken of one call's batches, reported to the server as the credit
    that lets it send more (`serving/credit.py`): the call's later requests. Each report also
    carries the loop's exposed data wait so far (`data_wait_s`), so the server can tell
    whether the trainer waits for it.

    Args:
      hold: called before each report (the request thread's; e.g. `Quiet.hold`, so the report
        and the batch it brings do not land in the loop's dispatch).
    """

    def __init__(self, hold: Callable[[], None] | None = None):
        self._hold = hold
        # (batches taken, seconds waited in all): one attribute, so the request thread never
        # reads a count with another report's wait.
        self.latest = (0, 0.0)
        self._ended = False
        # A note a change: the training loop's `took` is one call into C, which wakes the
        # request thread only when it sleeps (a Condition's notify is a dozen Python steps,
        # and this runs in the loop's `next()`).
        self._changed: queue.SimpleQueue = queue.SimpleQueue()

    def took(self, wait_s: float) -> None:
        """One more batch taken; `wait_s`: the seconds the loop has waited for this stream's
        batches in all, up to and including this one."""
        self.latest = (self.latest[0] + 1, wait_s)
        self._changed.put(None)

    def end(self) -> None:
        self._ended = True
        self._changed.put(None)

    def requests(self, first: pb.StreamBatchesRequest) -> Iterator[pb.StreamBatchesRequest]:
        """The call's requests: `first`, then the latest count and wait whenever the count has
        grown (several batches taken between two sends go as one report). An old server skips
        `data_wait_s` as an unknown field; 0 (nothing waited yet) reads as "not reported"."""
        yield first
        reported = 0
        while True:
            self._changed.get()
            with contextlib.suppress(queue.Empty):  # the notes of later changes: read below
                while True:
                    self._changed.get_nowait()
            if self._ended:
                return
            if self._hold is not None:
                self._hold()
            count, wait_s = self.latest
            if count != reported:
                reported = count
                yield pb.StreamBatchesRequest(batches_taken=reported, data_wait_s=wait_s)
