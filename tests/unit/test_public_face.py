"""The package's public face: each name in `input_server.__all__` imports, and
`import input_server` alone stays cheap (no gRPC, Grain or JAX until a name is asked for)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import input_server

HOMES = {
    "Server": "input_server.serving.server",
    "ServerConfig": "input_server.serving.config",
    "Pipeline": "input_server.batching.pipeline",
}


def test_all_names_the_public_face():
    assert sorted(input_server.__all__) == sorted([*HOMES, "__version__"])
    assert isinstance(input_server.__version__, str)


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_public_name_imports_as_its_home_defines_it(name):
    exec(f"from input_server import {name}", namespace := {})
    assert namespace[name] is getattr(importlib.import_module(HOMES[name]), name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        input_server.Nothing  # noqa: B018


def test_importing_the_package_loads_no_grpc_grain_or_jax():
    heavy = ("grpc", "grain", "jax", "numpy")
    code = (
        "import sys, input_server; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
