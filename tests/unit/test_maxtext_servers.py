"""The MaxText adapter's `--server` string: one server or a fan-in, and its mistakes now."""

from __future__ import annotations

import pytest

from input_client import maxtext
from input_client.maxtext import split_servers


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("unix:///run/s.sock", ["unix:///run/s.sock"]),
        ("unix:///a.sock,unix:///b.sock", ["unix:///a.sock", "unix:///b.sock"]),
        ("unix:///odd,name.sock", ["unix:///odd,name.sock"]),
        ("unix:///a.sock, unix-abstract:b", ["unix:///a.sock", "unix-abstract:b"]),
        ("pool-0.pool.ns.svc:50051,pool-1.pool.ns.svc:50051",
         ["pool-0.pool.ns.svc:50051", "pool-1.pool.ns.svc:50051"]),
        ("ipv4:10.0.0.1:1,10.0.0.2:1", ["ipv4:10.0.0.1:1,10.0.0.2:1"]),  # gRPC's own list
    ],
)  # fmt: skip
def test_a_server_string_names_one_server_or_several(value, want):
    assert split_servers(value) == want


def test_configure_takes_a_fan_in_and_refuses_its_mistakes_at_once(tmp_path):
    maxtext.configure("unix:///a.sock,unix:///b.sock", order="arrival")
    assert maxtext._settings.server == ("unix:///a.sock", "unix:///b.sock")
    assert maxtext._settings.order == "arrival"
    maxtext.configure("unix:///a.sock")
    assert maxtext._settings.server == "unix:///a.sock"
    with pytest.raises(ValueError, match="twice"):
        maxtext.configure("h:1,h:1")
    with pytest.raises(ValueError, match="order"):
        maxtext.configure("h:1,h2:1", order="fastest")
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    token.chmod(0o600)
    with pytest.raises(ValueError, match="in the clear"):
        maxtext.configure("127.0.0.1:1,10.0.0.9:1", token_file=str(token))
    maxtext.configure("127.0.0.1:1,[::1]:1", token_file=str(token))
