"""What MaxText's `MultiHostDataLoadIterator` wraps: a re-iterable source of host-local batches.

MaxText calls `iter()` on its dataloader when the iterator is built and at every `reset()`
(each eval), then checkpoints the object `iter()` returned through `get_state()` (UTF-8 JSON
bytes, saved as `iter/process_{i}-of-{n}.json`) and restores it with `set_state(bytes)` before
its first `next()`. So the stream opens lazily, at the first `next()`, from the state last set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from input_client.iterator import BatchIterator
from input_client.maxtext.check import MaxTextConfigError
from input_client.maxtext.conventions import to_maxtext
from input_client.wire import decode_state, encode_state, is_resume_state

OpenStream = Callable[[dict[str, Any] | None], BatchIterator]

# Streams that failed in this process. MaxText turns any exception from `next()` into a quiet
# "Training stopped" and exits 0; the launcher reads this to exit 1 with the failure.
failures: list[BaseException] = []


class ServerIterator:
    """Host-local MaxText batches from one stream of the server, resumable from its state.

    Attributes:
      wait_time_s: seconds `next()` waited for data, over every stream this object opened.
    """

    def __init__(self, open_stream: OpenStream, *, pad_id: int, packing: str):
        self._open_stream = open_stream
        self._pad_id = pad_id
        self._packing = packing
        self._state: dict[str, Any] | None = None
        self._stream: BatchIterator | None = None
        self._waited_before = 0.0

    @property
    def wait_time_s(self) -> float:
        return self._waited_before + (self._stream.wait_time_s if self._stream else 0.0)

    def __iter__(self) -> ServerIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        try:
            if self._stream is None:
                self._stream = self._open_stream(self._state)
            batch = next(self._stream)
        except StopIteration:  # the end of a finite spec: MaxText stops cleanly
            raise
        except Exception as e:
            failures.append(e)
            raise
        self._state = self._stream.get_state()
        return to_maxtext(batch, self._pad_id, self._packing)

    def get_state(self) -> bytes:
        """The position after the last batch returned, as MaxText's checkpoint stores it."""
        return encode_state(self._state or {})

    def set_state(self, blob: bytes) -> None:
        """Continues right after the batch `blob` (a `get_state()` result) belongs to.

        Raises MaxTextConfigError for anything else, e.g. the state of MaxText's own Grain
        iterator, saved under the same run name before the switch to the server."""
        try:
            state = decode_state(bytes(blob))
            ours = not state or is_resume_state(state)  # {}: from the start
        except ValueError:  # not JSON, or not an object
            ours = False
        if not ours:
            shown = bytes(blob)[:120].decode(errors="replace")
            raise MaxTextConfigError(
                f"the checkpoint's data state is not an input server's position ({shown!r}); "
                f"was this run started with another input pipeline? Start a new run_name."
            )
        self.close()
        self._state = state or None

    def close(self) -> None:
        if self._stream is not None:
            self._waited_before += self._stream.wait_time_s
            self._stream.close()
            self._stream = None


class ServerSource:
    """A dataloader for `MultiHostDataLoadIterator`: each `iter()` starts at the beginning of
    the stream (a fresh pass for eval; for training, MaxText then sets the checkpoint's state)."""

    def __init__(self, open_stream: OpenStream, *, pad_id: int, packing: str):
        self._open_stream = open_stream
        self._pad_id = pad_id
        self._packing = packing
        self._current: ServerIterator | None = None
        self._waited_before = 0.0

    @property
    def wait_time_s(self) -> float:
        """Seconds MaxText's loop waited for this source's batches, over every pass."""
        return self._waited_before + (self._current.wait_time_s if self._current else 0.0)

    def __iter__(self) -> ServerIterator:
        if self._current is not None:
            self._current.close()  # a reset: the old pass's stream is not needed any more
            self._waited_before += self._current.wait_time_s
        self._current = ServerIterator(
            self._open_stream, pad_id=self._pad_id, packing=self._packing
        )
        return self._current
