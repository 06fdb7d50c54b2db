"""The addresses a server may listen on (off loopback only with TLS and a token:
tests/integration/test_tls.py), the default one both sides share, and what the client tells
from an address before dialing it."""

from __future__ import annotations

import os

import pytest

from input_server.serving.server import parse_address


@pytest.mark.parametrize(
    "address", ["0.0.0.0:5000", "10.1.2.3:5000", "[::]:5000", "example.com:80"]
)
def test_non_loopback_addresses_parse_as_such(address):
    # Served only with TLS and a token (`tls.check_exposure`), refused otherwise.
    parsed = parse_address(address)
    assert parsed.bind == address and not parsed.is_unix and not parsed.loopback


@pytest.mark.parametrize(
    "address", ["127.0.0.1:0", "localhost:0", "[::1]:0", "unix:/tmp/x.sock", "unix-abstract:input"]
)
def test_loopback_and_unix_addresses_are_accepted(address):
    assert parse_address(address).bind == address
    assert parse_address(address).loopback


# --- The client's side: the default address, and what an address says before dialing ----------


def test_the_server_listens_where_the_client_dials_by_default(tmp_path, monkeypatch):
    import tempfile

    from input_client import addresses
    from input_server.serving import auth

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert auth.default_socket() == addresses.default_socket()
    assert addresses.default_socket() == (
        f"unix://{tmp_path}/input-server-{os.geteuid()}/input-server-{os.geteuid()}.sock"
    )


@pytest.mark.parametrize(
    "address, path",
    [
        ("unix:///tmp/a.sock", "/tmp/a.sock"),
        ("unix:/tmp/a.sock", "/tmp/a.sock"),
        ("unix:rel.sock", "rel.sock"),
        ("unix-abstract:name", None),
        ("127.0.0.1:5000", None),
    ],
)
def test_socket_path_of_a_target(address, path):
    from input_client.addresses import socket_path

    assert socket_path(address) == path


@pytest.mark.parametrize(
    "address, path_like",
    [
        ("/tmp/a.sock", True),
        ("./a.sock", True),
        ("a.sock", True),
        ("unix:///tmp/a.sock", False),
        ("localhost:5000", False),
        ("[::1]:5000", False),
        ("dns:///host:5000", False),
    ],
)
def test_a_path_without_its_scheme_is_told_from_a_host(address, path_like):
    from input_client.addresses import looks_like_a_path

    assert looks_like_a_path(address) is path_like


def test_a_client_refuses_a_default_folder_open_to_others(tmp_path, monkeypatch):
    import tempfile

    from input_client import InputClient

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"input-server-{os.geteuid()}"
    folder.mkdir()
    folder.chmod(0o755)
    with pytest.raises(PermissionError, match="0755"):
        InputClient()
    folder.chmod(0o700)
    with InputClient() as client:
        assert client.address == f"unix://{folder}/input-server-{os.geteuid()}.sock"


@pytest.mark.parametrize(
    "state, answers, nobody_answers",
    [
        ("listening", True, False),
        ("bound, not listening", False, True),  # a server's socket after a SIGKILL
        ("missing", False, False),
    ],
)
def test_a_socket_file_answers_or_refuses_as_its_listener_is(
    tmp_path, state, answers, nobody_answers
):
    import socket

    from input_client import addresses

    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        if state != "missing":
            s.bind(path)
            if state == "listening":
                s.listen()
        assert addresses.answers(path) is answers
        assert addresses.nobody_answers(path) is nobody_answers
