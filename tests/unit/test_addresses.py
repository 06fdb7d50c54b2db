"""The addresses a server may listen on: loopback and Unix sockets only."""

from __future__ import annotations

import pytest

from input_server.serving.server import parse_address


@pytest.mark.parametrize(
    "address", ["0.0.0.0:5000", "10.1.2.3:5000", "[::]:5000", "example.com:80"]
)
def test_non_loopback_addresses_are_refused(address):
    with pytest.raises(ValueError, match="loopback"):
        parse_address(address)


@pytest.mark.parametrize(
    "address", ["127.0.0.1:0", "localhost:0", "[::1]:0", "unix:/tmp/x.sock", "unix-abstract:input"]
)
def test_loopback_and_unix_addresses_are_accepted(address):
    assert parse_address(address).bind == address
