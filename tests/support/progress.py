"""A child process's progress lines said on pytest's terminal as they come, past its output
capture, under pytest-xdist too: a suite that goes quiet for minutes looks hung."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest

PREFIX = "maxtext_venv: "  # scripts/tools/maxtext_venv.sh's progress lines on stderr


def run_saying_progress(
    config: pytest.Config, argv: list[str], *, shown: bool = True, timeout: float = 1200
) -> tuple[int, str, str]:
    """Runs `argv`, its `PREFIX` lines on stderr said on the terminal as they come (with
    `shown`), past pytest's capture, under pytest-xdist too; its exit status, stdout and
    stderr (pip's lines kept for a failure)."""
    with _terminal(config) if shown else contextlib.nullcontext() as say:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr = []
        for line in proc.stderr:
            stderr.append(line)
            if say and line.startswith(PREFIX):
                say(line.rstrip())
        stdout = proc.stdout.read()
        returncode = proc.wait(timeout=timeout)
    return returncode, stdout, "".join(stderr)


@contextlib.contextmanager
def _terminal(config: pytest.Config):
    """A `write(line)` to pytest's terminal, its output capture suspended meanwhile.

    A pytest-xdist worker's terminal reporter writes where nobody reads (the suite's default
    run said nothing for the build's ten minutes): there the line goes to the worker's
    stderr, which xdist leaves on the terminal, prefixed with the worker's name.
    """
    capture = config.pluginmanager.getplugin("capturemanager")
    worker = getattr(config, "workerinput", {}).get("workerid")
    with capture.global_and_fixture_disabled():
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if worker is None and reporter is not None:
            reporter.ensure_newline()
            yield reporter.write_line
            return

        def write(line: str) -> None:
            sys.stderr.write(f"[{worker}] {line}\n" if worker else f"{line}\n")
            sys.stderr.flush()

        yield write
