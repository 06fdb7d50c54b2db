"""docs/pod.md stays runnable: its Python blocks parse, and so do its shell blocks (`bash -n`)
and the Python files they write; README's documentation list links to it."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest

from tests.support.pages import README, code_blocks, page

POD_DOC = page("docs/pod.md")
BLOCKS = code_blocks(POD_DOC)


def _heredocs(shell: str) -> dict[str, str]:
    """The files a shell block writes with `cat > NAME <<'EOF'`, by name."""
    return dict(re.findall(r"^cat > (\S+) <<'EOF'\n(.*?)^EOF$", shell, flags=re.S | re.M))


def test_every_block_is_python_bash_or_printed_text():
    assert {language for language, _ in BLOCKS} == {"python", "bash", "text"}


@pytest.mark.parametrize(
    "code", [c for language, c in BLOCKS if language == "python"], ids=lambda c: c[:30]
)
def test_a_python_block_parses(code):
    ast.parse(code)


@pytest.mark.parametrize(
    "shell", [c for language, c in BLOCKS if language == "bash"], ids=lambda c: c[:30]
)
def test_a_shell_block_parses_and_so_do_the_python_files_it_writes(shell):
    done = subprocess.run(["bash", "-n"], input=shell, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    for name, text in _heredocs(shell).items():
        if name.endswith(".py"):
            ast.parse(text, filename=name)


def test_the_cpu_pod_writes_its_trainer_and_runs_it_on_two_processes():
    shell = next(c for language, c in BLOCKS if language == "bash" and "pod_train.py" in c)
    trainer = _heredocs(shell)["pod_train.py"]
    assert '"jax_cpu_collectives_implementation", "gloo"' in trainer
    assert "num_processes=2" in trainer and "timer.flush()" in trainer
    for i in range(2):
        assert (
            f"input-server serve --data-root pod-data --listen unix:///tmp/pod-{i}.sock &" in shell
        )
        assert f"python3 pod_train.py {i} unix:///tmp/pod-{i}.sock" in shell


def test_readme_links_the_pod_doc():
    assert "- [docs/pod.md](docs/pod.md)" in README
