"""What a worker process adds to the host's memory (`measure.added_bytes`): its own pages and
the shared memory it made, not the pages of files it maps, which every worker shares."""

from __future__ import annotations

import subprocess
import sys

import psutil

from input_server.autotune.measure import added_bytes, mapped_added_bytes

MIB = 1 << 20
CHILD = """
import mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
sum(m[i] for i in range(0, len(m), 4096))  # every page of the file resident, shared
own = bytearray(int(sys.argv[2]))  # anonymous: this process's alone
for i in range(0, len(own), 4096):
    own[i] = 1
from multiprocessing import shared_memory
made = shared_memory.SharedMemory(create=True, size=int(sys.argv[3]))  # /dev/shm: made here
for i in range(0, made.size, 4096):
    made.buf[i] = 1
print("ready", flush=True)
sys.stdin.read()
made.close()
made.unlink()
"""


def test_a_mapped_file_is_not_counted_and_own_and_shared_memory_are(tmp_path):
    shared = tmp_path / "library.bin"
    shared.write_bytes(b"\1" * (96 * MIB))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(shared), str(48 * MIB), str(32 * MIB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        process = psutil.Process(child.pid)
        rss = process.memory_info().rss
        assert rss >= (96 + 48 + 32) * MIB  # RSS holds the file's pages and the process's own
        # As the kernel's totals say it, and as gVisor's mappings do (read here the same way).
        for added in (added_bytes(process), mapped_added_bytes(process)):
            assert (48 + 32) * MIB <= added <= rss - 90 * MIB, (rss / MIB, added / MIB)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
