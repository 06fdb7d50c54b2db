"""Whether a fast backend is faster here: a trial of it against the reference on the stream's own
groups, a phase of each, under the stream's own threads, on this host (`Trial`, whose verdict is a
`Speed`).

A backend's speed is a fact of the host and of the stream's parallelism, not of the library,
nor of a probe: on the TPU host (13 cores, gVisor) kitoken was faster than the reference on
one thread and far slower on eight, while a check of it in the gate read it faster
(docs/benchmarks.md, "Choosing a backend by measuring"). Only the stream's own groups, under
its own parallelism, say which serves it faster. The ids are the same either way (the gate),
so the trial changes who makes a group, never its bytes.
"""

from __future__ import annotations

import dataclasses
import threading

# The trial runs in two phases, every group of each by one side (the backend's first): a side
# is timed in the regime it would serve in, its threads all calling it. Alternating group by
# group misled: a backend whose CPU a token grows with the calls at once (kitoken's did, its
# one encoder shared by every thread, until `fast.Kitoken` gave each call a copy) has its
# groups run while the reference's wait, and reads faster than it serves (docs/benchmarks.md,
# "Choosing a backend by measuring").
# Each phase's first WARM_GROUPS groups are not timed (they start beside the previous phase's
# groups still in flight); the next MEASURED_GROUPS are, and must hold MIN_TOKENS tokens.
WARM_GROUPS = 8
MEASURED_GROUPS = 16
PHASE_GROUPS = WARM_GROUPS + MEASURED_GROUPS
MIN_TOKENS = 20_000
# The reference's phase ends after EARLY_GROUPS timed groups when one side is already DECISIVE
# times faster: the phase costs its groups at the slower side's speed, and a backend 31 x the
# reference (fastokens on Llama 3 on the TPU host) paid 24 groups at 1/31 of its rate to
# confirm what four said.
EARLY_GROUPS = 4
DECISIVE = 2.0
# How much less time a token the backend must take to serve: what it saves must pay for the
# audit (one group in 64 encoded twice) and be more than the timing's noise.
MUST_SAVE = 0.9
# Groups after a verdict for the reference before the backend's next trial (the stream's
# parallelism, and the host's load, change while it serves): RETRIAL_GROUPS, times how many
# times slower the backend was, doubled for each verdict in a row that kept the reference, at
# most MAX_RETRIAL_GROUPS. A trial of a slow backend costs its phase at the backend's speed:
# kitoken at 0.15 x on the TPU host, tried every 512 groups, took a quarter of the stream's
# rate (4.8 against 6.5 M tokens/s).
RETRIAL_GROUPS = 512
MAX_RETRIAL_GROUPS = 1 << 20
# A verdict holds while the groups the stream encodes at once (its threads calling the
# tokenizer together: what the search and the loop's pace change) stay within
# CONCURRENCY_CHANGE x of those it was made at, read as the most at once in each
# CONCURRENCY_GROUPS groups, moved in CONCURRENCY_WINDOWS of them in a row: kitoken was 2.2 x
# the reference on the TPU host one group at a time and 0.3 x eight at a time, and a trial
# made while the search measured one thread let it serve eight at 0.27 x.
# A move must also be CONCURRENCY_MARGIN groups or more: a paced stream's one group at a time
# reads two whenever a group runs long.
CONCURRENCY_GROUPS = 32
CONCURRENCY_CHANGE = 2.0
CONCURRENCY_MARGIN = 2
CONCURRENCY_WINDOWS = 2


def moved(judged_at: int, now: int) -> bool:
    """Whether `now` groups at once is another regime than the `judged_at` a verdict serves
    in."""
    far = abs(now - judged_at) >= CONCURRENCY_MARGIN
    return far and not judged_at / CONCURRENCY_CHANGE < now < judged_at * CONCURRENCY_CHANGE


def retrial_after(verdict: Speed, in_a_row: int) -> int:
    """Groups before the next trial of a backend that lost `in_a_row` trials, the last by
    `verdict`."""
    slower = max(1.0, 1.0 / max(verdict.ratio, 1e-6))
    return int(min(MAX_RETRIAL_GROUPS, RETRIAL_GROUPS * slower * 2 ** max(0, in_a_row - 1)))


class Regime:
    """The groups a stream encodes at once (its threads calling the tokenizer together), read
    against those the last verdict serves at: `counted` says when they moved (`moved`) in
    CONCURRENCY_WINDOWS windows in a row. The verdict's regime is the most at once in the
    second window after it: a trial's own groups pile up while its slower side encodes, and
    the first window after holds its last ones. Not locked: its owner's lock holds every
    call. A worker process's copy keeps the verdict's regime and counts its own groups."""

    def __init__(self):
        self.inflight = 0  # groups being encoded now
        self.peak = 0  # the most at once since the window began
        self.window = 0  # groups counted in the window
        self.judged_at = 0  # the verdict's regime (0: none yet)
        self.settling = 0  # windows until the verdict's regime is read
        self.moved_windows = 0  # windows in a row that moved from it

    def __getstate__(self):
        return {"judged_at": self.judged_at, "settling": self.settling}

    def __setstate__(self, state):
        self.__init__()
        self.__dict__.update(state)

    def began(self) -> None:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)

    def ended(self) -> None:
        self.inflight -= 1

    def judged(self) -> None:
        """A verdict was made: its regime is read after the next window."""
        self.judged_at, self.settling, self.peak, self.window = 0, 2, 0, 0

    def trial_began(self) -> None:
        self.peak = self.moved_windows = 0

    def counted(self) -> bool:
        """Counts a group outside a trial; whether the regime moved from the verdict's."""
        self.window += 1
        if not (self.judged_at or self.settling) or self.window < CONCURRENCY_GROUPS:
            return False
        peak, self.peak, self.window = self.peak, 0, 0
        if self.settling:
            self.settling -= 1
            self.judged_at = 0 if self.settling else max(1, peak)
            return False
        self.moved_windows = self.moved_windows + 1 if moved(self.judged_at, peak) else 0
        return self.moved_windows >= CONCURRENCY_WINDOWS


@dataclasses.dataclass(frozen=True)
class Speed:
    """A trial's verdict: the wall time a token each side took on the stream's groups, ns
    (each group timed on the thread that encoded it, while the stream's other threads called
    the same side)."""

    backend: str
    groups: int  # the backend's timed groups
    reference_ns: float
    backend_ns: float
    reference_groups: int = 0  # the reference's (0: as many as the backend's)

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
            f"{self._groups_said()})"
        )
        return head if self.serves else f"{head}: the reference serves"

    def _groups_said(self) -> str:
        theirs = self.reference_groups or self.groups
        if theirs == self.groups:
            return f"{self.groups} groups each"
        return f"{self.groups} groups and {theirs}"

    @property
    def decisive(self) -> bool:
        """Whether one side is DECISIVE times faster than the other."""
        return not 1 / DECISIVE < self.ratio < DECISIVE


class Trial:
    """The backend `backend`, then the reference, each encoding PHASE_GROUPS of the stream's
    groups (`side`; the reference fewer when the verdict is decisive early), the measured
    ones' times noted (`record`); once both phases are measured, the verdict. Shared by the
    stream's threads."""

    def __init__(self, backend: str):
        self.backend = backend
        self._lock = threading.Lock()
        self.verdict: Speed | None = None
        self._reset()

    def _reset(self) -> None:
        self._turn = 0
        self._seconds = {"reference": 0.0, "backend": 0.0}
        self._tokens = {"reference": 0, "backend": 0}
        self._groups = {"reference": 0, "backend": 0}

    def __getstate__(self):  # a worker process's copy starts a trial of its own
        return {"backend": self.backend}

    def __setstate__(self, state):
        self.__init__(state["backend"])

    def side(self) -> tuple[str, bool] | None:
        """Who encodes the next group ("backend" or "reference") and whether it is timed;
        None once both phases are handed out (the choice serves until the verdict)."""
        with self._lock:
            if self.verdict is not None or self._turn >= 2 * PHASE_GROUPS:
                return None
            turn, self._turn = self._turn, self._turn + 1
        who = "backend" if turn < PHASE_GROUPS else "reference"
        return who, turn % PHASE_GROUPS >= WARM_GROUPS

    def record(self, side: str, seconds: float, tokens: int) -> Speed | None:
        """Notes a timed group `side` encoded; the verdict, the first time there is one."""
        with self._lock:
            if self.verdict is not None:
                return None
            self._seconds[side] += seconds
            self._tokens[side] += tokens
            self._groups[side] += 1
            backend, reference = self._groups["backend"], self._groups["reference"]
            if backend < MEASURED_GROUPS or reference < EARLY_GROUPS:
                return None
            timed = min(self._tokens.values()) >= MIN_TOKENS
            if reference < MEASURED_GROUPS and not timed:
                return None
            if not timed:  # too little to time: once more
                self._reset()
                return None
            speed = Speed(
                backend=self.backend,
                groups=backend,
                reference_ns=1e9 * self._seconds["reference"] / self._tokens["reference"],
                backend_ns=1e9 * self._seconds["backend"] / self._tokens["backend"],
                reference_groups=reference,
            )
            if reference >= MEASURED_GROUPS or speed.decisive:
                self.verdict = speed
            return self.verdict
