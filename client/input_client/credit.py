"""Flow control, the client's side: what the training loop has taken of a stream, reported to
the server as the credit that lets it send more (the server's side: `serving/credit.py`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from input_client.proto import pb


class Taken:
    """What the loop has taken of one call's batches, reported to the server as the credit
    that lets it send more (`serving/credit.py`): the call's later requests. Each report also
    carries the loop's exposed data wait so far (`data_wait_s`), so the server can tell
    whether the trainer waits for it."""

    def __init__(self):
        self.count = 0
        self.wait_s = 0.0
        self._ended = False
        self._cond = threading.Condition()

    def took(self, wait_s: float) -> None:
        """One more batch taken; `wait_s`: the seconds the loop has waited for this stream's
        batches in all, up to and including this one."""
        with self._cond:
            self.count += 1
            self.wait_s = wait_s
            self._cond.notify()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify()

    def requests(self, first: pb.StreamBatchesRequest) -> Iterator[pb.StreamBatchesRequest]:
        """The call's requests: `first`, then the latest count and wait whenever the count has
        grown (several batches taken between two sends go as one report). An old server skips
        `data_wait_s` as an unknown field; 0 (nothing waited yet) reads as "not reported"."""
        yield first
        reported = 0
        while True:
            with self._cond:
                while self.count == reported and not self._ended:
                    self._cond.wait()
                if self._ended:
                    return
                reported, wait_s = self.count, self.wait_s
            yield pb.StreamBatchesRequest(batches_taken=reported, data_wait_s=wait_s)
