"""Repository hygiene that CI checks through pytest: generated stubs are current, lint is clean."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT, SCRIPTS


def test_checked_in_stubs_match_the_protos(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_protos", SCRIPTS / "tools" / "gen_protos.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    for rel in gen.GENERATED:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes(), (
            f"{rel} is stale: run `python scripts/tools/gen_protos.py` and commit the result."
        )


@pytest.mark.skipif(
    shutil.which("ruff") is None and importlib.util.find_spec("ruff") is None,
    reason="ruff is a dev dependency; install with pip install -e '.[dev]'",
)
def test_ruff_is_clean(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # from any folder: ruff finds ROOT's settings
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_client_in_use_is_this_checkouts():
    """The editable install takes both packages from the tree; an `input-client` installed
    beside it would shadow the client's code, and the tests would run another copy."""
    import input_client

    assert pathlib.Path(input_client.__file__).resolve().is_relative_to(ROOT / "client"), (
        f"input_client comes from {input_client.__file__}: uninstall that input-client "
        f"(pip uninstall input-client) and reinstall with pip install -e '.[dev]'."
    )
