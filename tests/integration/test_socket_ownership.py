"""A Unix socket belongs to the server that made it: a live one is refused, a stale one replaced,
and a server removes only its own socket file."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from input_client import InputClient
from input_server.serving.server import Server, ServerConfig, parse_address


def answers(target: str) -> bool:
    with InputClient(target, connect_timeout_s=5) as c:
        return bool(c.info().server_version)


def test_a_second_serve_on_a_live_socket_refuses_and_leaves_the_first_reachable(tmp_path):
    path = tmp_path / "input.sock"
    target = f"unix://{path}"
    with Server(ServerConfig(listen=[target])):
        second = subprocess.run(
            [sys.executable, "-m", "input_server.cli", "serve", "--listen", target],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert second.returncode == 2
        assert "in use by a running server" in second.stderr
        assert "Traceback" not in second.stderr
        assert path.is_socket() and answers(target)  # the first server still serves
    assert not path.exists()  # the first one removed its own socket


def test_a_stale_socket_file_is_replaced(tmp_path):
    path = tmp_path / "input.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # bound, never listening: what a killed server leaves
    stale.close()
    with Server(ServerConfig(listen=[f"unix://{path}"])) as srv:
        assert answers(srv.targets[0])


def test_a_file_that_is_not_a_socket_is_refused_and_kept(tmp_path):
    path = tmp_path / "input.sock"
    path.write_text("not a socket")
    with pytest.raises(OSError, match="not a socket"):
        Server(ServerConfig(listen=[f"unix://{path}"]))
    assert path.read_text() == "not a socket"


def test_a_refused_server_removes_nothing(tmp_path):
    path = tmp_path / "input.sock"
    with Server(ServerConfig(listen=[f"unix://{path}"])) as first:
        with pytest.raises(OSError, match="in use by a running server"):
            # Its other address was bound first: the failed start releases it, and the live
            # server's socket stays.
            Server(ServerConfig(listen=[f"unix://{tmp_path}/other.sock", f"unix://{path}"]))
        assert path.is_socket() and answers(first.targets[0])
        assert not (tmp_path / "other.sock").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:65536", "localhost:123456"])
def test_listen_refuses_ports_above_65535(address):
    with pytest.raises(ValueError, match="out of range"):
        parse_address(address)


def test_listen_port_0_still_picks_a_free_port():
    with Server(ServerConfig(listen=["127.0.0.1:0"], insecure_tcp=True)) as srv:
        port = int(srv.targets[0].rsplit(":", 1)[1])
        assert 0 < port <= 65535 and answers(srv.targets[0])
