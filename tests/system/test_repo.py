"""Repository hygiene that CI checks through pytest: generated stubs are current, lint is clean."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT, SCRIPTS


def test_checked_in_stubs_match_the_protos(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_protos", SCRIPTS / "gen_protos.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    for rel in gen.GENERATED:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes(), (
            f"{rel} is stale: run `python scripts/gen_protos.py` and commit the result.")


@pytest.mark.skipif(shutil.which("ruff") is None and importlib.util.find_spec("ruff") is None,
                    reason="ruff is a dev dependency; install with pip install -e '.[dev]'")
def test_ruff_is_clean(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True,
                         text=True, cwd=tmp_path)  # from any folder: ruff finds ROOT's settings
    assert out.returncode == 0, out.stdout + out.stderr
