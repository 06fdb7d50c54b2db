"""The MaxText venv's build says each step on the terminal under the suite's default parallel
run (pytest-xdist), where it was silent for its ten minutes: the build's helper
(`tests.support.progress`) run in a real `pytest -n 2`, on a script that says three steps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support import ROOT

TEST = """
import sys

from tests.support.progress import PREFIX, run_saying_progress

STEPS = "; ".join(
    f"print('{PREFIX}step {i} of 3', file=sys.stderr, flush=True); time.sleep(0.2)"
    for i in (1, 2, 3)
)


def test_build(request):
    argv = [sys.executable, "-c", f"import sys, time; {STEPS}; print('/venv/bin/python')"]
    code, out, err = run_saying_progress(request.config, argv)
    assert code == 0 and out.strip() == "/venv/bin/python", err


def test_other():
    pass
"""


def test_each_build_step_reaches_the_terminal_under_xdist(tmp_path):
    (tmp_path / "test_build.py").write_text(textwrap.dedent(TEST))
    paths = [str(ROOT), os.path.join(ROOT, "client"), os.environ.get("PYTHONPATH", "")]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q"]
        + ["--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_build.py")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if "maxtext_venv: step" in line]
    assert [line.split("] ", 1)[1] for line in said] == [
        f"maxtext_venv: step {i} of 3" for i in (1, 2, 3)
    ], run.stderr[-3000:]
    assert all(line.startswith("[gw") for line in said), said
