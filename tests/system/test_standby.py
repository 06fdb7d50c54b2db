"""A standby server (`serve --standby`) beside a sidecar's server on the same socket file: it
waits, loaded, until the server ends (SIGKILL too), then takes the socket over at once, and the
stream goes on there exactly once. Real processes, real SIGKILLs, a real socket file; every
wait bounded."""

from __future__ import annotations

import subprocess
import time

import pytest

from input_client import InputClient
from input_server.serving.socket_lock import SocketLock
from tests.support import (
    ServerProcess,
    assert_same_batches,
    cli_argv,
    free_port,
    run_pipeline,
)


def _said(path, text: str, timeout_s: float = 60.0) -> str:
    """The log at `path` once it holds `text`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        said = path.read_text() if path.exists() else ""
        if text in said:
            return said
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not said within {timeout_s} s: {said[-2000:]}")


def test_a_standby_takes_over_a_killed_servers_socket_and_the_stream_goes_on(short_tmp, make_spec):
    spec = make_spec(batch={"seq_len": 512, "size": 4}, order={"epochs": 0})
    address = f"unix://{short_tmp}/s.sock"
    # The same metrics port, as copies of one sidecar's command: the standby binds it only
    # once it takes over.
    metrics = ["--metrics-port", str(free_port())]
    primary = ServerProcess(address, str(short_tmp / "primary.log"), args=metrics)
    standby = ServerProcess(address, str(short_tmp / "standby.log"), args=["--standby", *metrics])
    primary.start()
    try:
        _said(short_tmp / "primary.log", "serving on")
        standby.start()
        # Loaded and waiting: the primary's socket is still the primary's.
        _said(short_tmp / "standby.log", "standby: taking over")
        got = []
        with (
            InputClient(address, connect_timeout_s=30) as client,
            client.batches(spec, reconnect_deadline_s=60) as it,
        ):
            for _ in range(20):
                got.append(next(it))
            assert "serving on" not in (short_tmp / "standby.log").read_text()
            assert standby.child.p.poll() is None, (short_tmp / "standby.log").read_text()
            primary.kill()
            while it.reconnects == 0 or len(got) < 40:
                got.append(next(it))
                assert len(got) < 5000, "the kill never broke the stream"
            assert it.get_state()["seq"] == len(got)
        said = _said(short_tmp / "standby.log", "serving on")
        assert said.index("standby: taking over") < said.index("serving on")
    finally:
        standby.kill()
        primary.kill()
    assert_same_batches(got, run_pipeline(spec, limit=len(got)))


def _serve(*args: str) -> subprocess.CompletedProcess:
    """`input-server serve ARGS` that is expected to refuse its start: its exit and output."""
    return subprocess.run(cli_argv("serve", *args), capture_output=True, text=True, timeout=60)


def test_a_socket_whose_lock_is_held_is_refused(short_tmp):
    """A server on a socket file whose lock another process holds (a live server, or a standby
    that is taking it over) is refused at once, naming the path."""
    path = short_tmp / "held.sock"
    lock = SocketLock(str(path))
    assert lock.take()
    try:
        assert not SocketLock(str(path)).take()  # one holder
        out = _serve("--listen", f"unix://{path}")
        assert out.returncode == 2, out
        assert f"unix://{path}: in use by a running server" in out.stderr, out.stderr
        assert not path.exists()  # nothing bound
    finally:
        lock.release()
    assert SocketLock(str(path)).take()  # released: free for the next


@pytest.mark.parametrize("listen", ["unix-abstract:spare", "127.0.0.1:0"])
def test_a_standby_takes_over_socket_files_only(listen):
    out = _serve("--standby", "--listen", listen, "--insecure-abstract", "--insecure-tcp")
    assert out.returncode == 2, out
    assert (
        "--standby takes over socket files only (unix:///PATH.sock, or the default socket), "
        f"not --listen {listen}." in out.stderr
    ), out.stderr
    assert "Traceback" not in out.stderr
