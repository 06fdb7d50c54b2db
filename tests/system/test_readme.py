"""README stays true: its first screen, its quick start's one address, and its "Bring your own
data" commands run exactly as written, against a real server on the default address; the spec
reference's (docs/spec.md) examples are valid specs."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support import ROOT
from tests.support.pages import README, code_blocks, page, section

SPEC_DOC = page("docs/spec.md")
DEMO = "python3 -m pip install -e '.[dev]' && input-server demo"
TESTS = "python3 -m pip install -e '.[dev]' && python3 -m pytest"


def test_the_first_screen_says_what_it_is_and_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:40])
    assert first_screen.startswith("# input-server\n")
    assert "gRPC server" in first_screen and "JAX" in first_screen
    assert DEMO in first_screen and TESTS in first_screen
    assert README.index(DEMO) < README.index("## Contents") < README.index("## Quick start")


def test_the_quick_start_uses_one_address_and_names_its_data_root():
    quick = section("Quick start")
    blocks = [code for _, code in code_blocks(quick)]
    serve = next(c for c in blocks if c.startswith("input-server serve"))
    assert "--data-root" in serve and "--listen" not in serve  # the default address
    client = next(c for c in blocks if "InputClient" in c)
    assert "InputClient()" in client and "unix://" not in client
    loop = section("In a training loop")
    assert "InputClient()" in loop and "/tmp/input.sock" not in loop


# What README says to change for jsonl files, and for a checkpoint's tokenizer folder.
FOR_JSONL = "(jsonl: `*.jsonl` where they say `*.txt`)"
FOR_CKPT = '(skip step 1; `model = "ckpt"` and `kind = "huggingface"` for `my-data/ckpt/`)'


def _as_checkpoint(shell: str, folder) -> str:
    """README's commands with a Qwen-class checkpoint folder (as MaxText's qwen3-tokenizer:
    EOS <|im_end|>, pad <|endoftext|>, no BOS) in place of the tokenizer step 1 trains."""
    from input_server.data.builtin_corpora import stdlib_docstrings
    from input_server.testing.tokenizer_models import train_qwen2_bpe, write_hf_folder

    tokens = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    tok = train_qwen2_bpe(stdlib_docstrings(600))
    write_hf_folder(folder, tok, tokenizer_class="Qwen2Tokenizer", **tokens)
    lines = [x for x in shell.splitlines() if not x.startswith("input-server tokenizer train")]
    assert len(lines) == len(shell.splitlines()) - 1
    shell = "\n".join(lines)
    assert shell.count('model = "spm.model"') == 1
    return shell.replace('model = "spm.model"', 'model = "ckpt"\nkind = "huggingface"')


@pytest.mark.parametrize("corpus", ["txt", "jsonl", "checkpoint"])
def test_bring_your_own_data_runs_as_written(corpus, tmp_path, short_tmp):
    """As written, on a folder of plain text (a document a line); with README's one change,
    on jsonl, or with a checkpoint's tokenizer folder. The same documents either way."""
    from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl

    text = section("Bring your own data")
    blocks = code_blocks(text)
    shell = [code for lang, code in blocks if lang == "bash"]
    python = [code for lang, code in blocks if lang == "python"]
    assert len(shell) == 1 and len(python) == 1, blocks
    assert "input-server tokenizer train" in shell[0] and "input-server serve" in shell[0]
    assert FOR_JSONL in " ".join(text.split()) and shell[0].count("*.txt") == 2
    assert FOR_CKPT in " ".join(text.split())

    (tmp_path / "my-data").mkdir()
    # Enough real text for the README's vocabulary, a docstring a line in the text file.
    docs = stdlib_docstrings(5000)
    if corpus == "jsonl":
        shell[0] = shell[0].replace("*.txt", "*.jsonl")
        write_jsonl(docs, tmp_path / "my-data" / "docs.jsonl")
    else:
        lines = (" ".join(d.split()) for d in docs)
        (tmp_path / "my-data" / "docs.txt").write_text("".join(f"{d}\n" for d in lines if d))
    if corpus == "checkpoint":
        shell[0] = _as_checkpoint(shell[0], tmp_path / "my-data" / "ckpt")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(short_tmp)  # the default address: a fresh private folder in there
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # `input-server` as this interpreter runs it: no installed entry point needed.
    prelude = f'input-server() {{ "{sys.executable}" -m input_server.cli "$@"; }}\nset -e\n'
    log = open(tmp_path / "shell.log", "w+")  # noqa: SIM115 - closed below
    shell_proc = subprocess.Popen(
        ["bash", "-c", prelude + shell[0]],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # the backgrounded server stays in this process group
    )
    try:
        assert shell_proc.wait(timeout=240) == 0, log.read()
        client = subprocess.run(
            [sys.executable, "-c", python[0]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert client.returncode == 0, client.stderr + (tmp_path / "shell.log").read_text()
        steps = re.findall(r"batch (\d): \(8, 512\), (\d+) tokens", client.stdout)
        assert [s for s, _ in steps] == ["0", "1", "2", "3", "4"], client.stdout
        assert all(int(n) > 8 * 512 * 0.8 for _, n in steps)  # packed rows, mostly real tokens
    finally:
        with contextlib.suppress(ProcessLookupError):  # a shell that failed is gone already
            os.killpg(shell_proc.pid, signal.SIGTERM)  # as `kill %1` would
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _group_alive(shell_proc.pid):
            time.sleep(0.2)
        if _group_alive(shell_proc.pid):
            os.killpg(shell_proc.pid, signal.SIGKILL)
            pytest.fail("the server did not stop on SIGTERM")
    out = (tmp_path / "shell.log").read_text()
    log.close()
    if corpus != "checkpoint":
        assert "wrote my-data/spm.model: unigram, 8,000 pieces (pad 0, bos 1, eos 2, unk 3)" in out
    assert "serving on unix://" in out and "SIGTERM: drained" in out, out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_spec_references_toml_examples_are_valid_specs():
    import tomllib

    from input_client import PipelineSpec

    blocks = [code for lang, code in code_blocks(SPEC_DOC) if lang == "toml"]
    assert len(blocks) >= 3  # the whole spec, a mixture, a spec without a model
    for code in blocks:
        tables = tomllib.loads(code)
        tables.setdefault("tokenizer", {"model": "spm.model"})  # the mixture's example
        spec = PipelineSpec.from_dict(tables)
        assert spec.sources[0].paths
    mixture = PipelineSpec.from_dict({**tomllib.loads(blocks[1]), "tokenizer": {"model": "m"}})
    assert [s.weight for s in mixture.sources] == [0.7, 0.3] and mixture.all_named
