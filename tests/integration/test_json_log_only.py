"""`--log-format json` writes only JSON lines on stderr, also where the CLI itself once wrote
plain ones: a usage error, a refusal at start, an uncaught exception. (stdout keeps its
`serving on` line: scripts read the address there.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import cli_argv


def _records(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    records = []
    for line in lines:
        record = json.loads(line)  # a plain line fails here, named
        assert isinstance(record, dict), line
        assert {"time", "level", "logger", "message"} <= set(record), line
        records.append(record)
    return records


@pytest.mark.parametrize(
    "args, words",
    [
        (["serve", "--listen", "127.0.0.1:1", "--log-format", "json"], "--token-file"),
        (["serve", "--log-format=json", "--no-such-flag"], "unrecognized arguments"),
    ],
    ids=["refused-at-start", "usage-error"],
)
def test_a_mistake_at_start_is_a_json_line(args, words):
    run = subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    records = _records(run.stderr)
    assert any(words in r["message"] and r["level"] == "ERROR" for r in records), records


def test_an_uncaught_exception_is_one_json_record():
    """A thread's or the main thread's uncaught exception (a bug) is one record with its
    traceback, not 20 plain lines; a stray print to stderr is a record too."""
    script = (
        "import logging, sys, threading\n"
        "from input_server.serving.logs import configure\n"
        "logging.basicConfig()\n"
        "configure('json')\n"
        "print('a stray line', file=sys.stderr)\n"
        "t = threading.Thread(target=lambda: 1 / 0, name='worker-7')\n"
        "t.start(); t.join()\n"
        "raise RuntimeError('the main thread too')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert run.returncode == 1, run.stderr
    records = _records(run.stderr)
    assert len(records) == 3, records
    stray, thread, main = records
    assert stray["message"] == "a stray line" and stray["logger"] == "stderr"
    assert "worker-7" in thread["message"] and "ZeroDivisionError" in thread["traceback"]
    assert "RuntimeError" in main["traceback"] and main["level"] == "CRITICAL"


def _env() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [root, os.path.join(root, "client"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
