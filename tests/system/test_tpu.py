"""On a TPU VM: `serve` keeps the processes it spawns off the chip (`JAX_PLATFORMS=cpu` unless
the operator set it), and every command docs/tpu.md shows parses: shell with `bash -n`, Python
with `ast.parse`, each `input-server ...` with the CLI's own parser and the MaxText launcher's
line with the launcher's."""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys

import pytest

from input_server.testing.processes import ChildProcess, cli_argv
from tests.support import ROOT
from tests.support.pages import code_blocks

PAGE = (ROOT / "docs" / "tpu.md").read_text()
# Words that end a simple command, and those that start its redirections (always last here).
CONTROL = {"&&", "||", ";", "&", "|"}
REDIRECT = {">", ">>", "<", ">&", "&>", "2>"}
# Runs the CLI in a process that imported JAX first: `keep_jax_out` then stands aside, and
# the worker processes import JAX with Grain, reading JAX_PLATFORMS as they do.
AFTER_JAX = "import sys, jax; from input_server.cli import main; sys.exit(main(sys.argv[1:]))"


def _worker_environments(tmp_path, spec, argv_head: list[str], env: dict) -> list[dict]:
    """The environments of the worker processes a real `serve` spawns for `spec`'s stream,
    read from /proc while the stream runs (the server's own /proc environ is the one it was
    started with: what it sets later reaches only the processes it starts)."""
    import psutil

    from input_client import InputClient

    roots = {os.path.dirname(p) for p in (*spec.sources[0].paths, spec.tokenizer.model)}
    args = ["serve", "--listen", f"unix://{tmp_path}/s.sock"]
    args += [a for r in sorted(roots) for a in ("--data-root", r)]
    child = ChildProcess([*argv_head, *args], log=str(tmp_path / "s.log"), read_lines=True, env=env)
    try:
        line = child.lines.get(timeout=120)
        assert line and "serving on" in line, (tmp_path / "s.log").read_text()
        with InputClient(line.split("serving on ", 1)[1].split()[0]) as client:
            with client.batches(spec) as it:
                next(it)  # the worker processes live while the stream does
                server = psutil.Process(child.p.pid)
                workers = [p for p in server.children() if "spawn_main" in " ".join(p.cmdline())]
                environs = []
                for p in workers:
                    with open(f"/proc/{p.pid}/environ", "rb") as f:
                        pairs = (w.partition(b"=") for w in f.read().split(b"\0") if w)
                        environs.append({k.decode(): v.decode() for k, _, v in pairs})
    finally:
        child.kill()
    return environs


@pytest.mark.parametrize(
    "operator, jax_first, expected",
    [
        pytest.param(None, False, "cpu", id="unset-becomes-cpu"),
        pytest.param("tpu", False, "tpu", id="the-operators-value-kept"),
        pytest.param(None, True, "cpu", id="cpu-where-jax-was-loaded-before-serve"),
    ],
)
def test_serves_workers_run_with_jax_platforms_cpu_unless_the_operator_set_it(
    tmp_path, make_spec, operator, jax_first, expected
):
    """One program at a time may hold a TPU chip: every worker process of a `serve` sees
    `JAX_PLATFORMS=cpu`, also where JAX was loaded before `serve` ran (there the stub that
    keeps JAX out of the workers stands aside, and they import JAX), unless the operator
    set the variable, whose value is then left as it is."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if operator is not None:
        env["JAX_PLATFORMS"] = operator
    head = [sys.executable, "-c", AFTER_JAX] if jax_first else cli_argv()
    spec = make_spec(workers={"count": 1, "threads": 1}, order={"epochs": 1})
    environs = _worker_environments(tmp_path, spec, head, env)
    assert len(environs) == 1, environs
    assert environs[0].get("JAX_PLATFORMS") == expected


def test_keep_off_the_chip_sets_only_an_unset_variable_and_undoes_it(monkeypatch):
    from input_server.cli.serve import keep_off_the_chip

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    undo = keep_off_the_chip()
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    undo()
    assert "JAX_PLATFORMS" not in os.environ
    monkeypatch.setenv("JAX_PLATFORMS", "")  # set, if empty: the operator's choice
    keep_off_the_chip()()
    assert os.environ["JAX_PLATFORMS"] == ""


def simple_commands(shell: str) -> list[list[str]]:
    """Each simple command of a shell block as its words: lines joined at a trailing
    backslash, comments dropped, split at `&&`, `;`, `&`, `|`, without its redirections,
    its leading `VAR=value` words and a leading `nohup`."""
    commands = []
    for line in shell.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word not in CONTROL:
                words.append(word)
                continue
            cut = next((i for i, w in enumerate(words) if w in REDIRECT), len(words))
            words = words[:cut]
            while words and ("=" in words[0] and words[0].split("=")[0].isidentifier()):
                words.pop(0)
            if words and words[0] == "nohup":
                words.pop(0)
            if words:
                commands.append(words)
            words = []
    return commands


def _parses_as_input_server(words: list[str]) -> str:
    """The command `input-server WORDS[1:]` names, as the CLI's own parser reads the line."""
    from input_server.cli import build_parser, parse_arguments

    try:
        return parse_arguments(build_parser(), words[1:]).command
    except SystemExit as e:  # argparse's refusal, its message on stderr
        pytest.fail(f"{shlex.join(words)}: the CLI refused it (exit {e.code})")


def _check_command(words: list[str], seen: list[str]) -> None:
    """Parses one command the page shows, if it is one of the project's or Python's."""
    from input_client.maxtext.train import parse_args

    program = os.path.basename(words[0])
    if program == "input-server":
        seen.append(f"input-server {_parses_as_input_server(words)}")
    elif program.startswith("python") and words[1:3] == ["-m", "input_client.maxtext.train"]:
        try:
            args = parse_args(words[3:])
        except SystemExit as e:
            pytest.fail(f"{shlex.join(words)}: the launcher refused it (exit {e.code})")
        assert args.server.startswith("unix://"), words
        assert all("=" in a for a in args.maxtext), args.maxtext  # MaxText's key=value
        seen.append("launcher")
    elif program.startswith("python") and words[1:2] == ["-c"]:
        ast.parse(words[2])
        seen.append("python -c")


def test_every_command_on_the_page_parses():
    blocks = code_blocks(PAGE)
    assert {lang for lang, _ in blocks} <= {"", "bash", "python", "ini"}, blocks
    seen: list[str] = []
    for lang, code in blocks:
        if lang == "python":
            ast.parse(code)
            seen.append("python")
            continue
        if lang == "ini":  # the systemd unit: its command is the CLI's
            lines = code.replace("\\\n", " ").splitlines()  # systemd's continuations
            starts = [x for x in lines if x.startswith("ExecStart=")]
            assert len(starts) == 1, code
            _check_command(shlex.split(starts[0].removeprefix("ExecStart=")), seen)
            continue
        checked = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
        assert checked.returncode == 0, f"{code}\n{checked.stderr}"
        for words in simple_commands(code):
            _check_command(words, seen)
    # What the page is for: the sidecar started three ways, asked, MaxText, a loop, a probe.
    assert seen.count("input-server serve") == 3, seen
    assert {"input-server info", "launcher", "python", "python -c"} <= set(seen), seen


def test_the_page_shows_serve_on_a_unix_socket_with_a_data_root():
    serves = [
        words
        for lang, code in code_blocks(PAGE)
        if lang in ("", "bash")
        for words in simple_commands(code)
        if os.path.basename(words[0]) == "input-server" and words[1] == "serve"
    ]
    assert serves, PAGE
    for words in serves:
        assert words[words.index("--listen") + 1].startswith("unix:///"), words
        assert "--data-root" in words, words


def test_readme_and_the_maxtext_page_link_the_page():
    readme = (ROOT / "README.md").read_text()
    maxtext = (ROOT / "docs" / "maxtext.md").read_text()
    assert "](docs/tpu.md)" in readme
    assert "](tpu.md)" in maxtext
