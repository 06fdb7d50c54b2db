"""The client package's public face."""

from __future__ import annotations

import input_client


def test_public_names_import():
    for name in input_client.__all__:
        assert getattr(input_client, name) is not None
