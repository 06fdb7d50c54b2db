"""The idle CPU the audit may take: the host's idle time over a span, within what a cgroup's CPU
quota leaves; unknown where the kernel does not count (gVisor's /proc/stat is all zeros)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from input_server.serving import idle_cpu
from input_server.serving.idle_cpu import IdleCpu


class _Readings:
    """The kernel's counters as a test sets them: the host's are not the project's."""

    def __init__(self):
        self.t, self.host, self.quota = 0.0, 0.0, None

    def clock(self):
        return self.t

    def host_idle(self):
        return self.host

    def cgroup(self):
        return self.quota


def test_idle_cores_over_a_span_within_the_cgroups_quota():
    r = _Readings()
    idle = IdleCpu(clock=r.clock, host=r.host_idle, quota=r.cgroup)
    assert idle.cores() == 0.0  # no span yet: nothing counts as idle
    r.t, r.host = 1.0, 1.5  # 1.5 core-seconds idle over one second
    assert idle.cores() == pytest.approx(1.5)
    r.t += 0.1  # within MIN_SPAN_S: the last reading holds
    r.host += 10
    assert idle.cores() == pytest.approx(1.5)
    # A quota of 1 core, 0.8 of it used over the span: 0.2 left, however idle the host is.
    r.quota = (1.0, 5.0)
    r.t += 1.0
    idle.cores()
    r.t, r.host, r.quota = r.t + 1.0, r.host + 3.0, (1.0, 5.8)
    assert idle.cores() == pytest.approx(0.2)


def test_a_kernel_that_does_not_count_says_nothing():
    r = _Readings()
    idle = IdleCpu(clock=r.clock, host=lambda: None, quota=r.cgroup)
    r.t = 1.0
    assert idle.cores() is None


@pytest.mark.skipif(idle_cpu.host_idle_s() is None, reason="/proc/stat does not count here")
def test_processes_that_take_every_core_leave_none_idle():
    burn = "import time\nt = time.monotonic() + 20\nwhile time.monotonic() < t:\n    pass\n"
    cores = len(os.sched_getaffinity(0))
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(cores)]
    try:
        idle = IdleCpu()
        time.sleep(1.0)  # the burners running
        idle = IdleCpu()
        time.sleep(1.0)
        assert idle.cores() < 0.5, idle.cores()
    finally:
        for p in burners:
            p.kill()
            p.wait()
