"""The CPU that is idle where the server runs, measured (`IdleCpu`): the host's idle time in
/proc/stat, within what the server's cgroup may still use of its CPU quota (v2's `cpu.max` and
`cpu.stat`, v1's `cpu.cfs_quota_us` and `cpuacct.usage`).

What the tokenizer audit may take (`audit_pace`): a producer that waits on its client says
nothing of the CPU, which a CPU-bound client on the same cores needs (the audit took 57-73 % of
such a client's rate on the 2-core host, issue 47). Where the kernel does not say (gVisor's
/proc/stat reads all zeros on the TPU host), `cores()` is None and the caller decides without it.
"""

from __future__ import annotations

import os
import threading
import time

# Seconds between readings: a reading spans at least this long (the kernel's counters move in
# 10 ms ticks).
MIN_SPAN_S = 0.25
_TICK = os.sysconf("SC_CLK_TCK")  # Linux only: /proc/stat counts in these
_CGROUP = "/sys/fs/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def host_idle_s() -> float | None:
    """Seconds the cores this process may run on (its CPU affinity: a container's cpuset)
    have been idle (idle + iowait) since boot; None where /proc/stat does not count (gVisor:
    all zeros)."""
    text = _read("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None
    mine = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    idle = counted = 0
    for line in text.splitlines()[1:]:
        name, *fields = line.split()
        if not name.startswith("cpu"):
            break
        if name in mine:
            numbers = [int(x) for x in fields]
            counted += sum(numbers)
            idle += numbers[3] + (numbers[4] if len(numbers) > 4 else 0)
    return idle / _TICK if counted else None


def cgroup_quota() -> tuple[float, float] | None:
    """(cores the server's cgroup may use, its CPU seconds used so far), or None without a
    quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`)."""
    v2 = _read(f"{_CGROUP}/cpu.max")
    if v2 is not None and v2.split():
        quota, period = (v2.split() + ["100000"])[:2]
        stat = _read(f"{_CGROUP}/cpu.stat") or ""
        used = next((int(x.split()[1]) for x in stat.splitlines() if x.startswith("usage_usec")), 0)
        return None if quota == "max" else (int(quota) / int(period), used / 1e6)
    quota = _read(f"{_CGROUP}/cpu/cpu.cfs_quota_us")
    period = _read(f"{_CGROUP}/cpu/cpu.cfs_period_us")
    usage = _read(f"{_CGROUP}/cpuacct/cpuacct.usage")
    if not quota or not period or int(quota) <= 0:
        return None
    return int(quota) / int(period), int(usage or 0) / 1e9


class IdleCpu:
    """Cores idle over the last span of at least MIN_SPAN_S: the host's, or what the cgroup's
    quota leaves if that is less. Read from any thread; one reading a span."""

    def __init__(self, clock=time.monotonic, host=host_idle_s, quota=cgroup_quota):
        self._clock, self._host, self._quota = clock, host, quota
        self._lock = threading.Lock()
        self._last = self._sample()
        # Before the first span: none idle where the kernel counts (what is not measured yet
        # is no CPU to take), unknown where it does not.
        self._cores: float | None = None if self._last[1] is None else 0.0

    def _sample(self):
        return self._clock(), self._host(), self._quota()

    def cores(self) -> float | None:
        """Idle cores over the latest span (0 before the first); None where the host does
        not say."""
        with self._lock:
            now = self._clock()
            if now - self._last[0] >= MIN_SPAN_S:
                new = self._sample()
                self._cores = _idle(self._last, new)
                self._last = new
            return self._cores


def _idle(old, new) -> float | None:
    (t0, host0, quota0), (t1, host1, quota1) = old, new
    span = t1 - t0
    if host0 is None or host1 is None or span <= 0:
        return None
    idle = max(0.0, (host1 - host0) / span)
    if quota0 is not None and quota1 is not None:
        cores, _ = quota1
        idle = min(idle, max(0.0, cores - (quota1[1] - quota0[1]) / span))
    return idle
