"""Whether a fast backend is faster here: a trial of it against the reference on the stream's own
groups, alternated, under the stream's own threads, on this host (`Trial`, whose verdict is a
`Speed`).

A backend's speed is a fact of the host, not of the library, nor of a probe. On the TPU host
(13 cores, gVisor) kitoken served sentencepiece at 2.3 M tokens/s on one thread against the
reference's 1.0, but 2.5 against 6.7 on eight (3,022 against 1,056 ns of server CPU a token);
timed in the gate on 64 documents, eight threads at once, it read 1.7-2.1 x faster. Only the
stream's own groups, under its own parallelism, say which serves it faster (docs/benchmarks.md,
"Choosing a backend by measuring"). The ids are the same either way (the gate), so the trial
changes who makes a group, never its bytes.
"""

from __future__ import annotations

import dataclasses
import threading

# Groups each side encodes before the verdict, and the fewest tokens each must have made (a
# timing over less than a few ms means little).
TRIAL_GROUPS = 6
MIN_TOKENS = 20_000
# How much less time a token the backend must take to serve: what it saves must pay for the
# audit (one group in 64 encoded twice) and be more than the timing's noise.
MUST_SAVE = 0.9
# Groups after a verdict before the next trial: the stream's parallelism, and the host's load,
# change while it serves.
RETRIAL_GROUPS = 512


@dataclasses.dataclass(frozen=True)
class Speed:
    """A trial's verdict: the wall time a token each side took on the stream's groups, ns
    (each group timed on the thread that encoded it, beside the stream's other threads)."""

    backend: str
    groups: int
    reference_ns: float
    backend_ns: float

    @property
    def ratio(self) -> float:
        """The backend's speed as a multiple of the reference's (> 1: faster)."""
        return self.reference_ns / max(self.backend_ns, 1e-9)

    @property
    def serves(self) -> bool:
        return self.backend_ns <= MUST_SAVE * self.reference_ns

    def said(self) -> str:
        """What the choice says: the ratio and who serves on it."""
        head = (
            f"{self.backend} {self.ratio:.2f} x the reference's speed on this stream's groups "
            f"here ({self.backend_ns:,.0f} against {self.reference_ns:,.0f} ns a token, "
            f"{self.groups} groups each)"
        )
        return head if self.serves else f"{head}: the reference serves"


class Trial:
    """The backend `backend` and the reference alternated over the stream's groups
    (`side`), each group's time noted (`record`) until both have TRIAL_GROUPS groups and
    MIN_TOKENS tokens: then the verdict. Shared by the stream's threads."""

    def __init__(self, backend: str):
        self.backend = backend
        self._lock = threading.Lock()
        self._turn = 0
        self._seconds = {"reference": 0.0, "backend": 0.0}
        self._tokens = {"reference": 0, "backend": 0}
        self._groups = {"reference": 0, "backend": 0}
        self.verdict: Speed | None = None

    def __getstate__(self):  # a worker process's copy starts a trial of its own
        return {"backend": self.backend}

    def __setstate__(self, state):
        self.__init__(state["backend"])

    def side(self) -> str | None:
        """Who encodes the next group ("backend" or "reference"); None once judged."""
        with self._lock:
            if self.verdict is not None:
                return None
            self._turn += 1
            return "backend" if self._turn % 2 else "reference"

    def record(self, side: str, seconds: float, tokens: int) -> Speed | None:
        """Notes a group `side` encoded; the verdict, the first time there is one."""
        with self._lock:
            if self.verdict is not None:
                return None
            self._seconds[side] += seconds
            self._tokens[side] += tokens
            self._groups[side] += 1
            if min(self._groups.values()) < TRIAL_GROUPS or min(self._tokens.values()) < MIN_TOKENS:
                return None
            self.verdict = Speed(
                backend=self.backend,
                groups=min(self._groups.values()),
                reference_ns=1e9 * self._seconds["reference"] / self._tokens["reference"],
                backend_ns=1e9 * self._seconds["backend"] / self._tokens["backend"],
            )
            return self.verdict
