"""README's "Try it on a CPU" runs as written (real MaxText 0.2.5 in the venv its script
builds, a real server started by the recipe's own line), from the files of "Bring your own
data": only the socket and output folder move into the test's folder, and fewer steps run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from input_server.data.tokenizers.trainers import train_sentencepiece
from tests.support import ROOT
from tests.support.pages import block

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]


def test_the_cpu_recipe_trains_as_written(maxtext_python, tmp_path, docs):
    data = tmp_path / "my-data"
    data.mkdir()
    # As "Bring your own data" writes its spec now: plain text, a document a line.
    lines = (" ".join(d.split()) for d in docs)
    (data / "docs.txt").write_text("".join(f"{d}\n" for d in lines if d))
    shutil.copy(train_sentencepiece(docs, tmp_path / "spm", vocab_size=1000), data / "spm.model")
    own_data = block("Bring your own data", "[batch]")
    (data / "pipeline.toml").write_text(own_data.split("<<'EOF'\n")[1].split("\nEOF")[0] + "\n")
    recipe = block("Use with MaxText", "maxtext_venv.sh")
    for old, new in (
        ("unix:///tmp/input.sock", f"unix://{tmp_path}/input.sock"),
        ("/tmp/maxtext-out", str(tmp_path / "out")),
        ("steps=20", "steps=3"),
    ):
        assert old in recipe, old
        recipe = recipe.replace(old, new)
    env = {**os.environ, "REPO": str(ROOT)}
    env.pop("XLA_FLAGS", None)  # tests/conftest.py's 8 CPU devices; a user's shell has one
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # `input-server` as this interpreter runs it; the server is up before the trainer dials.
    prelude = f'input-server() {{ "{sys.executable}" -m input_server.cli "$@"; }}\nset -e\n'
    log = open(tmp_path / "recipe.log", "w+")  # noqa: SIM115 - closed below
    shell = subprocess.Popen(
        ["bash", "-c", prelude + recipe],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # the backgrounded server stays in this process group
    )
    try:
        code = shell.wait(timeout=900)
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        time.sleep(1)
        try:
            os.killpg(shell.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log.seek(0)
    out = log.read()
    log.close()
    assert code == 0, out[-4000:]
    steps = [int(s) for s in re.findall(r"completed step: (\d+), ", out)]
    assert steps[-1] == 2 and "Traceback" not in out, out[-4000:]
