"""Fixtures of the system tests that run real MaxText."""

from __future__ import annotations

import contextlib
import subprocess

import pytest

from tests.support import ROOT, file_lock, python_or_skip, run_dir

SCRIPT = str(ROOT / "scripts" / "maxtext_venv.sh")
PREFIX = "maxtext_venv: "  # the script's progress lines on stderr


@pytest.fixture(scope="session")
def maxtext_python(request) -> str:
    """The python of the cached MaxText 0.2.5 venv (scripts/maxtext_venv.sh builds it once).
    A build (~2 GB, minutes) is said on the terminal, with its steps, past pytest's capture:
    a suite that goes quiet for minutes looks hung."""
    python_or_skip("3.12", "the MaxText venv")
    with file_lock(run_dir(request.config) / "maxtext-venv.lock"):  # one worker (or run) builds it
        return _built_venv(request)


def _built_venv(request) -> str:
    check = subprocess.run(["bash", SCRIPT, "--check"], capture_output=True, text=True)
    # A pytest-xdist worker has no terminal of its own: the run's other tests show progress.
    shown = check.returncode != 0 and request.config.pluginmanager.has_plugin("terminalreporter")
    with _terminal(request.config) if shown else contextlib.nullcontext() as say:
        proc = subprocess.Popen(
            ["bash", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        stderr = []
        for line in proc.stderr:  # the script's own lines, as they come; pip's kept for failure
            stderr.append(line)
            if say and line.startswith(PREFIX):
                say(line.rstrip())
        stdout = proc.stdout.read()
        returncode = proc.wait(timeout=1200)
    assert returncode == 0, "".join(stderr)[-3000:]
    return stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def _terminal(config: pytest.Config):
    """A `write(line)` to pytest's terminal, its output capture suspended meanwhile."""
    reporter = config.pluginmanager.getplugin("terminalreporter")
    with config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        reporter.ensure_newline()
        yield reporter.write_line
