"""Models loaded from their files, shared within a process by each file as it stands."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from input_server.data.tokenizers.checks import file_identity

T = TypeVar("T")

# The most models of one kind a process keeps loaded: few, as a server sees few models, and each
# of the tiktoken-based kinds holds its ranks twice (in Python and in tiktoken's Rust).
MAX_LOADED = 4


class LoadedModels(Generic[T]):
    """What one kind's loader made of each model file, kept by the file's identity
    (`checks.file_identity`: a changed file loads anew), the least recently used dropped past
    `cap`; one a kind, at module level, so every tokenizer of a file in the process shares it.

    The lock is not held while loading: a load is slow, and a model of another file need not
    wait for it. Two threads that miss the same file at once both load it, and the later copy
    is kept.
    """

    def __init__(self, cap: int = MAX_LOADED):
        """Keeps at most `cap` models.

        Raises:
          ValueError: `cap` is not positive.
        """
        if cap <= 0:
            raise ValueError(f"`cap` must be positive, got {cap}.")
        self.cap = cap
        self._held: collections.OrderedDict[tuple | None, T] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, load: Callable[[], T]) -> T:
        """The model of the file at `path` as it stands: the one kept, or `load()`'s, kept.

        Args:
          path: the model file (resolved).
          load: reads the file into what is kept; its exceptions pass through, nothing kept.
        """
        key = file_identity(path)
        with self._lock:
            hit = self._held.get(key)
            if hit is not None:
                self._held.move_to_end(key)
                return hit
        hit = load()
        with self._lock:
            self._held[key] = hit
            while len(self._held) > self.cap:
                self._held.popitem(last=False)
        return hit

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
