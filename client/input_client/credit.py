"""Flow control, the client's side: what the training loop has taken of a stream, reported to
the server as the credit that lets it send more (the server's side: `serving/credit.py`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from input_client.proto import pb


class Taken:
    """What the loop has taken of one call's batches, reported to the server as the credit
    that lets it send more (`serving/credit.py`): the call's later requests."""

    def __init__(self):
        self.count = 0
        self._ended = False
        self._cond = threading.Condition()

    def took(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify()

    def requests(self, first: pb.StreamBatchesRequest) -> Iterator[pb.StreamBatchesRequest]:
        """The call's requests: `first`, then the latest count whenever it has grown (several
        batches taken between two sends go as one report)."""
        yield first
        reported = 0
        while True:
            with self._cond:
                while self.count == reported and not self._ended:
                    self._cond.wait()
                if self._ended:
                    return
                reported = self.count
            yield pb.StreamBatchesRequest(batches_taken=reported)
