"""Where the repository and its scripts lie, so tests pass from any working folder."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def script(name: str) -> str:
    """The absolute path of scripts/NAME (`bench/bench_grpc.py`, `tools/chaos.py`), so script
    tests pass from any working folder."""
    return str(SCRIPTS / name)


def clean_copy(source, destination) -> pathlib.Path:
    """`source` copied without git's, builds' and caches' folders: what a fresh clone has, so a
    package built from it cannot take stale files from an earlier `build/`."""
    import shutil

    shutil.copytree(
        source,
        destination,
        ignore=shutil.ignore_patterns(
            ".git",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".pytest_cache",
            ".ruff_cache",
            ".venv",
        ),
    )
    return pathlib.Path(destination)
