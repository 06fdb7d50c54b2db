"""Fixtures of the system tests that run real MaxText."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import ROOT, python_or_skip


@pytest.fixture(scope="session")
def maxtext_python() -> str:
    """The python of the cached MaxText 0.2.5 venv (scripts/maxtext_venv.sh builds it once)."""
    python_or_skip("3.12", "the MaxText venv")
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "maxtext_venv.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]
