"""`tokenizer train`'s progress on stderr, while sentencepiece (silent) reads and trains."""

from __future__ import annotations

import sys
import threading
import time

from input_server.plurals import plural

PROGRESS_EVERY_S = 10.0  # a line at most this often: a long run is never silent for long


class Progress:
    """A line on stderr every `every_s` seconds while the run lasts (sentencepiece is silent
    at the log level we give it, and a large corpus takes minutes): what is being read, then
    how long training has taken. None in a run shorter than `every_s` (a mistake found at
    once stays one line); `every_s` 0 = none."""

    def __init__(self, every_s: float = PROGRESS_EVERY_S):
        self.every_s, self.start = every_s, time.monotonic()
        self.path, self.documents, self.lines = "", 0, 0
        self.trained = False  # reading is over: sentencepiece trains without calling back
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="train-progress", daemon=True)
        if every_s > 0:
            self._thread.start()

    def _tick(self) -> None:
        while not self._done.wait(self.every_s):
            took = f"{time.monotonic() - self.start:.0f} s"
            read = f"{plural(self.documents, 'document')}, {plural(self.lines, 'line')}"
            if self.trained:
                line = f"training… {took} (read {read})"
            else:
                line = f"reading {self.path}: {read} so far, {took}"
            print(f"tokenizer train: {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
