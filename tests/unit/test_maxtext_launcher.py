"""The MaxText launcher's command line, run as a user runs it (`python -m
input_client.maxtext.train`, a real process): data files MaxText cannot read and options it
does not have are refused in one line before MaxText is even looked up (this environment has
no MaxText: a run that gets that far says so), and its own options count wherever they stand
among MaxText's `key=value` arguments."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from input_client import PipelineSpec
from input_client.maxtext.train import parse_args

PROG = "python -m input_client.maxtext.train: "
NO_MAXTEXT = "MaxText is not installed in this environment"
SERVER = "unix:///nowhere/input.sock"  # never dialed: everything here stops before


def _launch(*args: str) -> tuple[int, str]:
    """The launcher's exit code and its one line (asserted: one line, no traceback)."""
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "input_client.maxtext.train", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30  # refused at once, not after a set-up
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith(PROG), lines
    return out.returncode, lines[0]


@pytest.fixture
def spec(tmp_path):
    model = tmp_path / "spm.model"
    model.write_bytes(b"a model")
    path = tmp_path / "train.toml"
    path.write_text(
        PipelineSpec(
            source={"paths": ["*.jsonl"]},
            tokenizer={"model": str(model)},
            batch={"seq_len": 128, "size": 4},
        ).to_toml()
    )
    return str(path)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["grain_train_files=/data/*.jsonl"], "'/data/*.jsonl' names JSON lines files"),
        (["grain_train_files=/data/a.jsonl.zst"], "'/data/a.jsonl.zst' names JSON lines"),
        (["grain_train_files=/data/*.txt"], "'/data/*.txt' names plain-text files"),
        (["grain_train_files=/d/a*.array_record,0.3;/d/b*.jsonl,0.7"], "'/d/b*.jsonl'"),
        (["grain_file_type=parquet", "grain_train_files=/d/*.jsonl"], "names JSON lines"),
        (  # with a config file, whose grain_file_type is MaxText's to read, still refused
            ["my.yml", "grain_train_files=/d/*.jsonl"],
            "names JSON lines",
        ),
        (
            ["grain_train_files=/d/*.array_record", "grain_eval_files=/d/e.jsonl"]
            + ["eval_interval=10"],
            "`grain_eval_files` '/d/e.jsonl'",
        ),
    ],
)
def test_json_lines_files_are_refused_before_maxtext_with_the_way_out(args, named):
    code, line = _launch("--server", SERVER, "steps=5", *args)
    assert code == 2 and named in line, line
    assert "--spec SPEC.toml" in line and "Parquet" in line and "ArrayRecord" in line


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["grain_train_files=/d/*.parquet"], ("Parquet files", "add grain_file_type=parquet")),
        (
            ["grain_file_type=parquet", "grain_train_files=/d/x.array_record-*"],
            ("ArrayRecord files but grain_file_type is 'parquet'", "grain_file_type=arrayrecord"),
        ),
    ],
)
def test_files_of_another_format_than_grain_file_type_are_refused_before_maxtext(args, needles):
    code, line = _launch("--server", SERVER, *args)
    assert code == 2 and all(n in line for n in needles), line
    # With the grain_file_type they name, the same files pass: such a run gets as far as
    # looking MaxText up. So do eval files with no eval (nothing reads them).
    fixed = f"grain_file_type={needles[1].split('=')[-1]}"
    code, line = _launch("--server", SERVER, *args, fixed, "grain_eval_files=/d/e.txt")
    assert code == 2 and NO_MAXTEXT in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["steps=5", "max_target_length=128", "--spec", "{spec}", "--server", SERVER],
        ["base_output_directory=/tmp/o", "--server", SERVER, "steps=5", "--spec={spec}"],
        ["--server", SERVER, "eval_interval=5", "--spec", "{spec}", "--eval-spec", "{spec}"],
        ["--server", SERVER, "steps=5", "--spec", "{spec}", "--", "--alsologtostderr"],
        # MaxText's grain_train_files is not read with --spec: JSON lines there are no mistake.
        ["grain_train_files=/d/*.jsonl", "--spec", "{spec}", "--server", SERVER],
    ],
)
def test_the_launchers_options_count_anywhere_on_the_line(spec, args):
    # Before: `--spec` after a key=value was MaxText's, and the launcher answered "no
    # training data named" (or "no eval spec was given"). Now the run gets as far as
    # looking MaxText up.
    code, line = _launch(*(a.format(spec=spec) for a in args))
    assert code == 2 and NO_MAXTEXT in line, line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["steps=5", "--steps=5"], "unknown option '--steps'"),
        (["--spec", "{spec}", "steps=5", "--run-name", "x"], "unknown option '--run-name'"),
        (["--serv", "x", "steps=5"], "unknown option '--serv'"),  # no abbreviations
    ],
)
def test_an_unknown_option_is_one_line_naming_it(spec, args, needle):
    code, line = _launch("--server", SERVER, *(a.format(spec=spec) for a in args))
    assert code == 2 and needle in line and "key=value" in line, line


def test_a_missing_option_value_or_server_is_one_line():
    assert "--spec: expected one argument" in _launch("--server", SERVER, "steps=5", "--spec")[1]
    assert "required: --server" in _launch("steps=5")[1]


def test_maxtexts_arguments_keep_their_order_around_the_launchers_options():
    args = parse_args(
        ["my.yml", "a=1", "--spec", "s.toml", "b=2", "--server", "x", "--", "--v=1", "c=3"]
    )
    assert (args.server, args.spec) == ("x", "s.toml")
    assert args.maxtext == ["my.yml", "a=1", "b=2", "--v=1", "c=3"]
