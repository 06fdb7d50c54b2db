"""Several hosts on one machine: two TLS servers, each in its own network namespace, and a
trainer in a third that fans in from both. One server is SIGKILLed mid-stream and restarted;
the batches must equal an uninterrupted run's, byte for byte. A trainer without the token, or
trusting another CA, is refused with one line. Skipped, with the kernel's reason, where
network namespaces cannot be made (not root; a container without CAP_SYS_ADMIN)."""

from __future__ import annotations

import json
import os
import queue
import sys
import time

import pytest

from tests.support import ROOT, ChildProcess, cli_argv, write_token_file
from tests.support.netns import Hosts, Unavailable

PORT = 50051
CLIENT = str(ROOT / "tests" / "fanin_client.py")
# How long a child may print nothing before the test calls it stuck: a hang guard, not a speed
# claim. The fan-in test takes ~3 s here, beside a CPU burner too; in a full suite beside one,
# a trainer once printed nothing in the 120 s the test then gave the whole rest of its run.
QUIET_S = 240


@pytest.fixture(scope="module")
def hosts():
    try:
        h = Hosts.make(3)
    except Unavailable as e:
        if os.environ.get("CI") == "true" and os.geteuid() == 0:
            raise  # CI runs as root on a kernel that has them: a failure, not a skip
        pytest.skip(f"network namespaces cannot be made here: {e}")
    with h:
        yield h


@pytest.fixture(scope="module")
def pki(hosts, tmp_path_factory):
    """A CA, a certificate for each server host's address, the token, and a CA nobody uses."""
    import trustme

    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    other.cert_pem.write_to_path(str(folder / "other-ca.pem"))
    for i, address in enumerate(hosts.addresses[:2]):
        cert = ca.issue_cert(address)
        cert.private_key_pem.write_to_path(str(folder / f"s{i}.key"))
        os.chmod(folder / f"s{i}.key", 0o600)  # the server refuses a key others may read
        cert.cert_chain_pems[0].write_to_path(str(folder / f"s{i}.pem"))
    token_file, _ = write_token_file(folder)
    return folder, token_file


class _Servers:
    """Server i in namespace i, listening on its namespace's address with TLS and the token."""

    def __init__(self, hosts: Hosts, pki, data_root: str, log: str):
        self.hosts, (self.pki, self.token_file) = hosts, pki
        self.data_root, self.log = data_root, log
        self.children: dict[int, ChildProcess] = {}

    def start(self, i: int) -> None:
        argv = cli_argv(
            "serve",
            "--listen", f"{self.hosts.addresses[i]}:{PORT}",
            "--tls-cert", str(self.pki / f"s{i}.pem"),
            "--tls-key", str(self.pki / f"s{i}.key"),
            "--token-file", self.token_file,
            "--data-root", self.data_root,
        )  # fmt: skip
        child = ChildProcess(self.hosts.argv(i, argv), log=self.log, read_lines=True)
        try:
            line = child.lines.get(timeout=QUIET_S)
        except queue.Empty:
            line = None
        if not line or "serving on" not in line:
            child.kill()
            with open(self.log) as f:
                raise AssertionError(f"server {i} did not start: {f.read()[-2000:]}")
        self.children[i] = child

    def kill(self, i: int) -> None:
        self.children.pop(i).kill()

    def addresses(self) -> str:
        return ",".join(f"{a}:{PORT}" for a in self.hosts.addresses[:2])

    def close(self) -> None:
        for i in list(self.children):
            self.kill(i)


@pytest.fixture(scope="module")
def servers(hosts, pki, data_dir, tmp_path_factory):
    s = _Servers(hosts, pki, data_dir, str(tmp_path_factory.mktemp("logs") / "servers.log"))
    try:
        s.start(0)
        s.start(1)
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def spec_file(make_spec, tmp_path_factory) -> str:
    spec = make_spec(batch={"seq_len": 128, "size": 4}, order={"epochs": 0})
    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_text(json.dumps(spec.to_dict()))
    return str(path)


def _trainer(hosts: Hosts, servers: _Servers, spec_file: str, log: str, *extra: str):
    """The fan-in client in namespace 2, printing a JSON line per batch."""
    argv = [sys.executable, CLIENT, "--servers", servers.addresses(), "--spec", spec_file, *extra]
    return ChildProcess(hosts.argv(2, argv), log=log, read_lines=True)


def _line(child: ChildProcess, log: str) -> str | None:
    """The child's next line (None: its output ended), within QUIET_S."""
    try:
        return child.lines.get(timeout=QUIET_S)
    except queue.Empty:
        with open(log) as f:
            raise AssertionError(f"nothing printed in {QUIET_S} s: {f.read()[-2000:]}") from None


def _lines(child: ChildProcess, log: str) -> list[dict]:
    """Every line the child prints until its output ends: however long that takes, as long as
    it keeps printing (its log's end says what it did when it stops)."""
    out = []
    while (line := _line(child, log)) is not None:
        out.append(json.loads(line))
    return out


# More than the killed server's window and the trainer's prefetch can hold at the pause: with
# 40, a loaded host's run had every batch of that server sent before the kill (0 reconnects).
_BATCHES = 120


@pytest.mark.timeout(600)  # a hang guard past QUIET_S: each of its steps may be slow here
def test_fan_in_across_hosts_survives_a_server_killed_mid_stream(
    hosts, pki, servers, spec_file, tmp_path
):
    folder, token_file = pki
    common = (
        "--tls-ca",
        str(folder / "ca.pem"),
        "--token-file",
        token_file,
        "--batches",
        str(_BATCHES),
    )
    log = str(tmp_path / "trainer.log")
    whole = _trainer(hosts, servers, spec_file, log, *common)
    want = _lines(whole, log)
    whole.kill()
    assert len(want) == _BATCHES + 1, open(log).read()[-2000:]

    # The trainer stops taking batches at batch 12 (its streams open, its prefetch and the
    # servers' windows full) until the pause file goes, so the kill lands mid-stream for sure.
    pause = tmp_path / "pause"
    pause.touch()
    broken = _trainer(
        hosts, servers, spec_file, log, *common, "--pause-after", "12", "--pause-file", str(pause)
    )
    got = []
    try:
        while not got or "paused" not in got[-1]:
            line = _line(broken, log)
            assert line is not None, open(log).read()[-2000:]
            got.append(json.loads(line))
        servers.kill(1)  # SIGKILL, mid-stream, worker processes too
        servers.start(1)  # the same address and certificate, as a restarted pod
        pause.unlink()
        got += _lines(broken, log)
    finally:
        broken.kill()
    got = [g for g in got if "paused" not in g]
    assert [g.get("sha256") for g in got[:_BATCHES]] == [w["sha256"] for w in want[:_BATCHES]]
    assert got[_BATCHES]["reconnects"] >= 1
    assert got[_BATCHES]["state"] == want[_BATCHES]["state"]


def test_a_trainer_without_the_token_or_trusting_another_ca_is_refused(
    hosts, pki, servers, spec_file, tmp_path
):
    folder, token_file = pki
    log = str(tmp_path / "trainer.log")
    cases = {
        "no token": ("--tls-ca", str(folder / "ca.pem")),
        "another CA": ("--tls-ca", str(folder / "other-ca.pem"), "--token-file", token_file),
    }
    answers = {}
    # A connect timeout far past what an answer takes (~1 s, a few beside a CPU burner): a
    # refusal that waited for it could not pass for an answer on a loaded host.
    connect_s = 120
    for name, extra in cases.items():
        start = time.monotonic()
        child = _trainer(
            hosts, servers, spec_file, log, *extra, "--batches", "2",
            "--connect-timeout-s", str(connect_s),
        )  # fmt: skip
        lines = _lines(child, log)
        child.kill()
        assert child.p.returncode == 1, (name, lines)
        assert time.monotonic() - start < connect_s / 2, name  # an answer, not the timeout
        answers[name] = lines[-1]
    assert answers["no token"]["code"] == "UNAUTHENTICATED"
    assert "token" in answers["no token"]["error"]
    assert "certificate" in answers["another CA"]["error"]
    assert "tls_ca" in answers["another CA"]["error"]
