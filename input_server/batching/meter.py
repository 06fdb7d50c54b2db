"""A stream's production counters: what its parallel stage and its producer did, added to
from any thread and read by the stream's live tuner (`autotune/live.py` turns two readings
into a window, `serving/retune.py` reads them) and by its accounting (`stages`: the seconds
of each stage, what `input-server stats` and the metrics show)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import numpy as np

from input_server.stages import STAGES, WORKER_STAGES

# Module-level alias so tests can stand in another clock.
clock = time.perf_counter


class LiveMeter:
    """Counters a stream's producer and its parallel stage add to (any thread), read as
    `Window`s by the stream's tuner."""

    def __init__(self):
        # Its tuner waits on it for batches (`wait_batches`), woken by each one, not polling.
        self._lock = threading.Condition()
        # `Sums`' fields (what each one sums is said there), read together by `totals`.
        self._batches = 0
        self._tokens = 0
        self._groups = 0
        self._group_s = 0.0
        self._waiting_s = 0.0
        self._blocked_s = 0.0
        self._stages = dict.fromkeys(STAGES, 0.0)
        self._sent_real = self._sent_padding = self._bytes_sent = 0
        self._audited = self._mismatches = self._failed = self._by_backend = 0

    def group(self, busy_s: float, waited_s: float, stage_s: np.ndarray | None = None) -> None:
        """A tokenized group reached the packer after `waited_s`, having taken `busy_s` in
        its worker, `stage_s` of it in each worker stage (`stages.WORKER_STAGES`)."""
        with self._lock:
            self._groups += 1
            self._group_s += busy_s
            self._waiting_s += waited_s
            self._stages["wait_workers"] += waited_s
            if stage_s is not None:
                for stage, seconds in zip(WORKER_STAGES, stage_s.tolist(), strict=True):
                    self._stages[stage] += seconds

    def audit(self, group) -> None:
        """A tokenized group (`TokenGroup`): made by a fast backend or not, encoded again by the
        reference tokenizer (audited) and differing or not; or the backend failed on it and
        the reference encoded it (fell back)."""
        with self._lock:
            self._by_backend += group.by_backend
            self._audited += group.audited
            self._mismatches += group.mismatched
            self._failed += group.fell_back

    def audits(self) -> tuple[int, int, int]:
        """(groups a fast backend made, groups audited, audits that found a difference) so
        far: the share verified is the second over the first."""
        with self._lock:
            return self._by_backend, self._audited, self._mismatches

    def backend_failures(self) -> int:
        with self._lock:
            return self._failed

    def batch(self, tokens: int, blocked_s: float) -> None:
        """A batch of `tokens` real tokens went into the send queue, after waiting `blocked_s`
        for room."""
        with self._lock:
            self._batches += 1
            self._tokens += tokens
            self._blocked_s += blocked_s
            self._stages["queue_full"] += blocked_s
            self._lock.notify_all()

    def add(self, stage: str, seconds: float) -> None:
        """`seconds` more in one of the stream's own stages (`stages.STREAM_STAGES`)."""
        with self._lock:
            self._stages[stage] += seconds

    def sent(self, nbytes: int, seconds: float, *, real: int, padding: int) -> None:
        """gRPC took a message of `nbytes` bytes in `seconds`, of batches holding `real` real
        tokens and `padding` pad ones."""
        with self._lock:
            self._bytes_sent += nbytes
            self._sent_real += real
            self._sent_padding += padding
            self._stages["send"] += seconds

    def sent_totals(self) -> tuple[int, int, int]:
        """(real tokens, pad tokens, bytes) of the messages sent so far."""
        with self._lock:
            return self._sent_real, self._sent_padding, self._bytes_sent

    def stage_seconds(self) -> dict[str, float]:
        """The seconds in each stage so far, every stage named."""
        with self._lock:
            return dict(self._stages)

    def wait_batches(
        self, at_least: int, timeout: float | None, until: Callable[[], bool] = lambda: False
    ) -> bool:
        """Waits up to `timeout` for `at_least` batches in all, or for `until()` to hold (call
        `wake` after making it hold); whether the batches came."""
        with self._lock:
            self._lock.wait_for(lambda: self._batches >= at_least or until(), timeout)
            return self._batches >= at_least

    def wake(self) -> None:
        """Wakes every `wait_batches` to look at its `until` again."""
        with self._lock:
            self._lock.notify_all()

    def totals(self) -> Totals:
        with self._lock:
            return Totals(
                at=clock(),
                batches=self._batches,
                tokens=self._tokens,
                groups=self._groups,
                group_s=self._group_s,
                waiting_s=self._waiting_s,
                blocked_s=self._blocked_s,
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sums:
    """The running sums a stream's tuner reads: the meter's since the stream began (`Totals`),
    or their growth over a window (`autotune.live.Window`)."""

    batches: int
    tokens: int  # real tokens
    groups: int
    group_s: float  # wall time the groups took in their workers
    waiting_s: float  # the in-order part waiting for the next group
    blocked_s: float  # the producer waiting for room in the send queue

    def since(self, start: Sums) -> dict[str, int | float]:
        """Each sum's growth from `start` to these, by field name (a window's `Sums`)."""
        now, then = dataclasses.asdict(self), dataclasses.asdict(start)
        return {f.name: now[f.name] - then[f.name] for f in dataclasses.fields(Sums)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Totals(Sums):
    """The meter's sums at the moment `at` (its `clock`); two of them make a window
    (`autotune.live.window`)."""

    at: float
