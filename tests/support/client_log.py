"""The client's warnings as a test sees them: each with when it came, while a block runs."""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Iterator


class Said(logging.Handler):
    """The warnings of the `input_client` logger: (monotonic time, message) each in `said`,
    in the order they came."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.said: queue.Queue = queue.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        self.said.put((time.monotonic(), record.getMessage()))

    @property
    def lines(self) -> list[str]:
        """The messages said so far."""
        return [message for _, message in list(self.said.queue)]


@contextlib.contextmanager
def client_warnings() -> Iterator[Said]:
    """The client's warnings said while the block runs."""
    handler = Said()
    logger = logging.getLogger("input_client")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
