"""A client dialing a Unix socket that does not exist says so within a second, and where a
server does listen when it is at another default path (issue 40, item 3).

Before: a missing socket file was a silent 30 s wait (10 s for `input-server info`), and with
another XDG_RUNTIME_DIR (tmux, an IDE, cron) `info` ended "is `input-server serve` running?"
while one ran at the other default path. Real `serve` and `info` processes, real sockets.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

from input_client import InputClient
from input_server.testing.processes import cli_argv
from tests.support import client_warnings, serve_cli

SAID_WITHIN_S = 1.0  # the warning's bound, from the start of the wait


def test_a_missing_socket_is_said_within_a_second_then_the_server_starting_there_is_reached(
    short_tmp,
):
    path = f"{short_tmp}/s.sock"
    outcome: list = []
    with client_warnings() as said:
        with InputClient(f"unix://{path}", connect_timeout_s=30) as client:

            def wait() -> None:
                try:
                    outcome.append(client.info().server_version)
                except Exception as e:  # noqa: BLE001 - the assertion below shows it
                    outcome.append(e)

            start = time.monotonic()
            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            at, message = said.said.get(timeout=10)
            assert at - start < SAID_WITHIN_S, (at - start, message)
            assert f"no socket at {path}" in message, message
            assert "waiting up to 30 s" in message, message
            # The wait goes on: a server started there now is reached by the same call.
            child, _ = serve_cli("--listen", f"unix://{path}", log=f"{short_tmp}/serve.log")
            try:
                waiter.join(timeout=15)
            finally:
                child.kill()
    assert outcome and isinstance(outcome[0], str) and outcome[0], outcome
    assert said.said.empty(), list(said.said.queue)  # said once


def _info_lines(env: dict[str, str], timeout_s: float) -> tuple[int, list[tuple[float, str]]]:
    """`input-server info --timeout-s T` run under `env`: its exit code and its stderr lines,
    each with the seconds from the process's start."""
    start = time.monotonic()
    p = subprocess.Popen(
        cli_argv("info", "--timeout-s", str(timeout_s)),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines = [(time.monotonic() - start, line.strip()) for line in p.stderr]
    return p.wait(timeout=30), lines


def test_info_with_another_xdg_runtime_dir_names_the_default_path_where_a_server_listens(
    short_tmp,
):
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(short_tmp)  # private (0700), as a default socket's folder must be
    served = f"{short_tmp}/input-server-{os.geteuid()}/input-server-{os.geteuid()}.sock"
    child, targets = serve_cli(log=f"{short_tmp}/serve.log", env=env)  # the default socket
    try:
        assert targets == [f"unix://{served}"]
        xdg = f"{short_tmp}/xdg"
        os.mkdir(xdg, 0o700)  # another session's runtime folder: the default moves there
        timeout_s = 4.0
        code, lines = _info_lines({**env, "XDG_RUNTIME_DIR": xdg}, timeout_s)
    finally:
        child.kill()
    dialed = f"{xdg}/input-server-{os.geteuid()}.sock"
    assert code == 2, lines
    (warned_at, warning), (ended_at, last) = lines[0], lines[-1]
    assert len(lines) == 2, lines
    assert f"no socket at {dialed}" in warning, warning
    # Said early in the wait, not at its end (the process's start-up is the rest).
    assert ended_at - warned_at > timeout_s - 1.5, lines
    for line in (warning, last):
        assert f"at the other default path unix://{served}" in line, line
    assert last.startswith("input-server: no input server reachable"), last
    assert "is `input-server serve` running?" not in last, last
