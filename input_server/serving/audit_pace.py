"""When a stream has room to audit every group its fast tokenizer backend makes.

The gate checks a backend on probes and the stream's first documents; after that one group in
`audit_every` is encoded again by the reference. A divergence the gate missed reaches batches
unseen in the other groups. The reference costs 5-14 x a fast backend's CPU, so auditing every
group always would cost most of the speed the backend brings; but a stream that is ahead of its
loop (the producer waits for room in the send queue) has workers idle between groups. While it
waits, every group is audited (`Routed.audit_spare`); when auditing slows it below the loop's
pace, it stops waiting and the audits go back to one group in `audit_every`. The loop's pace is
the demand, as the live tuner reads it.
"""

from __future__ import annotations

import time

# The share of a batch interval the producer spends waiting for room, smoothed over batches
# (an exponential mean with this weight for the newest): above ON every group is audited, below
# OFF one in `audit_every`. Apart, so a stream at the edge does not flip every batch.
WEIGHT = 0.1
ON, OFF = 0.3, 0.1


class AuditPace:
    """Reads the producer's waits for room (`waited`, each batch) and says whether the stream
    has room to spare."""

    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self._last = clock()
        self._share = 0.0
        self.spare = False

    def waited(self, seconds: float) -> bool:
        """The producer waited `seconds` for room to queue its latest batch; whether every
        group should be audited now."""
        now = self._clock()
        interval, self._last = now - self._last, now
        if interval > 0:
            share = min(1.0, seconds / interval)
            self._share += WEIGHT * (share - self._share)
        if self.spare and self._share < OFF:
            self.spare = False
        elif not self.spare and self._share > ON:
            self.spare = True
        return self.spare
