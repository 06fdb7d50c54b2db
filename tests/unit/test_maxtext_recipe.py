"""README's MaxText CPU recipe stays the one the MaxText tests run: its flags are
`tests.support.TINY_MAXTEXT` and the one-host flag, its sizes are its spec's, its venv is where
scripts/tools/maxtext_venv.sh builds it; and that script says what it builds before it builds."""

from __future__ import annotations

import os
import subprocess
import tomllib

from tests.support import ROOT, TINY_MAXTEXT
from tests.support.pages import block

SCRIPT = str(ROOT / "scripts" / "tools" / "maxtext_venv.sh")


def _recipe() -> dict[str, str]:
    """The key=value arguments of the recipe's launcher command."""
    recipe = block("Use with MaxText", "maxtext_venv.sh")
    command = recipe[recipe.index("-m input_client.maxtext.train") :].replace("\\\n", " ")
    return dict(a.split("=", 1) for a in command.split() if "=" in a and not a.startswith("-"))


def test_the_cpu_recipe_has_the_flags_the_maxtext_tests_use():
    recipe = _recipe()
    for flag in [*TINY_MAXTEXT, "skip_jax_distributed_system=true"]:
        key, value = flag.split("=", 1)
        assert recipe.get(key) == value, (flag, recipe)


def test_the_cpu_recipe_sizes_are_its_specs():
    # The spec of "Bring your own data", which the recipe names with --spec.
    text = block("Bring your own data", "[batch]").split("<<'EOF'\n")[1]
    spec = tomllib.loads(text.split("\nEOF")[0])
    recipe = _recipe()
    assert "--spec my-data/pipeline.toml" in block("Use with MaxText", "maxtext_venv.sh")
    assert int(recipe["max_target_length"]) == spec["batch"]["seq_len"]
    assert int(recipe["per_device_batch_size"]) == spec["batch"]["size"]  # one CPU device


def test_the_recipe_says_where_the_venv_goes_and_how_to_move_it():
    env = {k: v for k, v in os.environ.items() if k not in ("INPUT_SERVER_MAXTEXT_VENV",)}
    env.pop("XDG_CACHE_HOME", None)
    out = subprocess.run(["bash", SCRIPT, "--check"], capture_output=True, text=True, env=env)
    default = out.stdout.strip().replace(os.path.expanduser("~"), "~", 1)
    recipe = block("Use with MaxText", "maxtext_venv.sh")
    assert default in recipe and "INPUT_SERVER_MAXTEXT_VENV=DIR" in recipe, (default, recipe)
    assert "~2 GB" in recipe


def test_the_venv_script_says_what_it_builds_before_building(tmp_path):
    # No Python 3.12 to be found (a stand-in that fails): the script stops after saying what
    # it was about to build, where, and how to put it elsewhere.
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "python3.12"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "INPUT_SERVER_MAXTEXT_VENV": str(venv),
    }
    check = subprocess.run(["bash", SCRIPT, "--check"], capture_output=True, text=True, env=env)
    assert check.returncode == 1 and check.stdout.strip() == str(venv)
    out = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and lines[0].startswith("maxtext_venv: building MaxText 0.2.5")
    assert str(venv) in lines[0] and "~2 GB" in lines[0], lines
    assert "INPUT_SERVER_MAXTEXT_VENV" in lines[0]
    assert lines[-1] == "maxtext_venv: no Python 3.12 found (MaxText 0.2.5 needs it)"
    assert not venv.exists()
