"""When a stream has room to audit every group its fast tokenizer backend makes.

The gate checks a backend on probes and the stream's first documents; after that one group in
`audit_every` is encoded again by the reference. A divergence the gate missed reaches batches
unseen in the other groups. The reference costs 5-14 x a fast backend's CPU, so auditing every
group always would cost most of the speed the backend brings; but a stream that is ahead of its
loop (the producer waits for room in the send queue) has workers idle between groups. The share
of groups audited beyond one in `audit_every` (`Router.audit_share`) follows that room: it grows
while the producer waits more than HIGH of each batch interval and halves while it waits less
than LOW, so the audits take the room there is and leave a margin. The loop's pace is the
demand, as the live tuner reads it.

A producer that waits says the stream has room, not that the host has CPU: a CPU-bound client on
the same cores slows its reading, the producer waits, and audits took the client's cores (57-73 %
of its rate on the 2-core host, issue 47). So the share grows only while the host has IDLE_GROW
cores idle (`idle_cpu.IdleCpu`, measured) and halves when it has less than IDLE_HALVE. Where the
kernel does not say (gVisor), no idle CPU is seen and none is taken: one group in `audit_every`
(on the TPU host a paced loop's feed took 1.05 cores with kitoken and every group audited,
against 0.87 with the reference alone: docs/benchmarks.md).
"""

from __future__ import annotations

import time

from input_server.serving.idle_cpu import IdleCpu

# The share of the time the producer waits: exponential means of the waits and of the batch
# intervals, this weight for the newest batch. Batches share messages (16 of 16 x 1024 in one),
# so the producer waits once a message, long: the means span a couple of messages.
WEIGHT = 1 / 32
# The band the share audited is steered into: above HIGH it grows (x GROW, from at least
# START), below LOW it halves; between, it stays.
LOW, HIGH = 0.1, 0.25
GROW, START = 1.5, 1 / 16
# Idle cores the host must have for the share to grow, and below which it halves: an audit of
# a group runs on one of the stream's threads, about one core while it runs.
IDLE_GROW, IDLE_HALVE = 0.75, 0.25


class AuditPace:
    """Reads the producer's waits for room (`waited`, each batch) and says what share of the
    groups to audit beyond one in `audit_every`."""

    def __init__(self, clock=time.perf_counter, idle: IdleCpu | None = None):
        self._clock = clock
        self._idle = idle if idle is not None else IdleCpu()
        self._last = clock()
        self._wait_s = self._interval_s = 0.0
        self.share = 0.0

    def waited(self, seconds: float) -> float:
        """The producer waited `seconds` for room to queue its latest batch; the share of
        groups to audit now, 0 to 1."""
        now = self._clock()
        interval, self._last = now - self._last, now
        self._wait_s += WEIGHT * (min(seconds, interval) - self._wait_s)
        self._interval_s += WEIGHT * (interval - self._interval_s)
        waiting = self._wait_s / self._interval_s if self._interval_s > 0 else 0.0
        idle = self._idle.cores()
        if waiting > HIGH and idle is not None and idle >= IDLE_GROW:
            self.share = min(1.0, max(START, GROW * self.share))
        elif waiting < LOW or idle is None or idle < IDLE_HALVE:
            self.share = self.share / 2 if self.share > 1 / 256 else 0.0
        return self.share
