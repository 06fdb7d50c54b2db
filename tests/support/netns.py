"""Several hosts on one machine: network namespaces joined by veth pairs to a bridge that lives
in a namespace of its own, on a subnet of the test's own, so no traffic touches the host's
interfaces, and `input-server serve` started on one of them. Needs root (CAP_SYS_ADMIN) and
iproute2; `Hosts.make` raises `Unavailable` with the kernel's reason where namespaces cannot be
made (`hosts_or_skip`: the test skips).
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import time
from collections.abc import Sequence

from input_server.testing.processes import ChildProcess, cli_argv

# 10.231.0.0/24: private space (RFC 1918) the test claims; host i is 10.231.0.(i + 1).
SUBNET = "10.231.0"


class Unavailable(Exception):
    """Network namespaces cannot be made here (the message says why)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise Unavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


class Hosts:
    """`count` namespaces, `names[i]` at `addresses[i]`, all on one bridge; `close()` removes
    them (a namespace's veth ends go with it)."""

    def __init__(self, count: int, tag: str | None = None):
        tag = tag or f"is{os.getpid() % 100000}"
        self.hub = f"{tag}-hub"
        self.names = [f"{tag}-h{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self._made: list[str] = []

    @classmethod
    def make(cls, count: int, tag: str | None = None) -> Hosts:
        """The namespaces, made and wired.

        Raises:
          Unavailable: no `ip`, or the kernel refused (not root, no namespaces in a container).
        """
        if shutil.which("ip") is None:
            raise Unavailable("iproute2's `ip` is not installed")
        hosts = cls(count, tag)
        try:
            hosts._make()
        except BaseException:
            hosts.close()
            raise
        return hosts

    def _add(self, name: str) -> None:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)  # stale
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _make(self) -> None:
        self._add(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, (name, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            self._add(name)
            _ip("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"p{i}",
                "netns", self.hub)  # fmt: skip
            _ip("-n", self.hub, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")

    def argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside host `i`'s namespace."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def close(self) -> None:
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self._made = []

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def hosts_or_skip(count: int, tag: str | None = None) -> Hosts:
    """`Hosts.make`, or the test skipped where namespaces cannot be made; in CI, as root on a
    kernel that has them, a failure instead of a skip."""
    import pytest

    try:
        return Hosts.make(count, tag)
    except Unavailable as e:
        if os.environ.get("CI") == "true" and os.geteuid() == 0:
            raise
        pytest.skip(f"network namespaces cannot be made here: {e}")


def serve_in(
    hosts: Hosts,
    i: int,
    *args: str,
    log: str,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready: str = "serving on",
) -> ChildProcess:
    """`input-server serve ARGS` in host `i`'s namespace (after `prefix`, e.g. `prlimit ...`),
    once it printed a line holding `ready` (the health port's comes after "serving on"): its
    process, which the caller kills. Its stderr goes to `log`; its later stdout lines arrive in
    its `lines`.

    Raises:
      AssertionError: it did not start within 60 s (the log's end says why).
    """
    argv = hosts.argv(i, [*prefix, *cli_argv("serve", *args)])
    child = ChildProcess(argv, log=log, read_lines=True, env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            line = child.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is not None and ready in line:
            return child
        if line is None:  # its output ended, or 60 s passed
            child.kill()
            with open(log) as f:
                raise AssertionError(f"serve in {hosts.names[i]} did not start: {f.read()[-2000:]}")
