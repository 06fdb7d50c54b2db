"""Every mistake a user can make with a CLI verb prints one clear line and exits 2, never a
traceback."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import time

import pytest

from input_server import cli
from tests.support import assert_one_line, run_main


@pytest.fixture
def spec_file(tmp_path, corpus, spm_model):
    def write(model: str = spm_model, extra: str = "") -> str:
        path = tmp_path / "spec.toml"
        path.write_text(
            f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nmodel = "{model}"\n'
            f"[batch]\nseq_len = 128\nsize = 4\n{extra}"
        )
        return str(path)

    return write


@pytest.mark.parametrize("verb", ["info", "stats"])
def test_info_on_an_unreachable_tcp_address(capsys, verb):
    code, err = run_main(capsys, verb, "127.0.0.1:1", "--timeout-s", "1")
    assert_one_line(code, err, "no input server reachable", "127.0.0.1:1")


@pytest.mark.parametrize("verb", ["info", "stats"])
def test_info_on_a_unix_path_with_no_socket_suggests_serve(capsys, verb):
    code, err = run_main(capsys, verb, "unix:///nonexistent/input.sock", "--timeout-s", "1")
    assert_one_line(code, err, "no socket at /nonexistent/input.sock", "`input-server serve`")


@pytest.mark.parametrize("exists", [True, False], ids=["a-socket-file", "no-file"])
def test_info_on_a_socket_path_without_its_scheme_says_so_at_once(capsys, tmp_path, exists):
    path = tmp_path / "input.sock"
    with socket.socket(socket.AF_UNIX) as s:
        if exists:
            s.bind(str(path))
        start = time.monotonic()
        code, err = run_main(capsys, "info", str(path), "--timeout-s", "30")
    assert time.monotonic() - start < 5  # not the 30 s timeout: no waiting can fix it
    assert_one_line(code, err, f"unix://{path}", "is a socket file" if exists else "scheme")


def test_info_on_a_unix_path_that_is_no_socket(capsys, tmp_path):
    (tmp_path / "x.sock").write_text("")
    start = time.monotonic()
    code, err = run_main(capsys, "info", f"unix://{tmp_path}/x.sock", "--timeout-s", "30")
    assert time.monotonic() - start < 5
    assert_one_line(code, err, f"{tmp_path}/x.sock is not a socket")


@pytest.mark.parametrize("verb", ["tune", "bench"])
def test_a_missing_model(capsys, spec_file, tmp_path, verb):
    code, err = run_main(capsys, verb, spec_file(model=str(tmp_path / "missing.model")))
    assert_one_line(code, err, "tokenizer.model", "missing.model")


@pytest.mark.parametrize("verb", ["tune", "bench"])
@pytest.mark.parametrize(
    "extra, key",
    [
        ('packing = "best"', "batch.packing"),
        ("[workers]\ncont = 1", "workers.cont"),
        ("[wrokers]\ncount = 1", "wrokers"),
    ],
    ids=["bad-value", "unknown-key", "unknown-table"],
)
def test_a_bad_spec(capsys, spec_file, verb, extra, key):
    code, err = run_main(capsys, verb, spec_file(extra=extra))
    assert_one_line(code, err, key)


@pytest.mark.parametrize("kind", ["mixture", "pre-tokenized"])
def test_bench_of_what_it_does_not_compare_points_to_bench_mixture(
    capsys, tmp_path, corpus, spm_model, kind
):
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"ids": [5, 6, 7]}\n' * 10)
    source = (
        f'[[source]]\npaths = ["{corpus}"]\n[[source]]\npaths = ["{corpus}"]\n'
        if kind == "mixture"
        else f'[source]\npaths = ["{ids}"]\ntoken_field = "ids"\n'
    )
    path = tmp_path / "spec.toml"
    path.write_text(f'{source}[tokenizer]\nmodel = "{spm_model}"\n')
    code, err = run_main(capsys, "bench", str(path))
    assert_one_line(code, err, "`source`", "scripts/bench/bench_mixture.py")


@pytest.mark.parametrize(
    "content",
    [b"[source\n", b"\xff\xfe\x00", b"x = " + b"9" * 5000],
    ids=["toml", "encoding", "digits"],
)
def test_a_spec_file_that_is_not_toml(capsys, tmp_path, content):
    path = tmp_path / "spec.toml"
    path.write_bytes(content)
    code, err = run_main(capsys, "tune", str(path))
    assert_one_line(code, err, "is not valid TOML")


@pytest.mark.parametrize("path", ["/nonexistent/spec.toml", "/"], ids=["missing", "folder"])
def test_a_spec_path_that_is_no_file(capsys, path):
    code, err = run_main(capsys, "tune", path)
    assert_one_line(code, err, path)


def test_tune_plot_without_matplotlib_is_refused_before_measuring(spec_file, tmp_path):
    # matplotlib made unimportable in a child process: the refusal must come before the
    # measuring run (which would take tune_seconds), not after it.
    code = (
        "import sys; sys.modules['matplotlib'] = None; from input_server.cli import main; "
        f"sys.exit(main(['tune', {spec_file()!r}, '--tune-seconds', '30', "
        f"'--plot', {str(tmp_path / 'x.png')!r}]))"
    )
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert_one_line(out.returncode, out.stderr, "matplotlib")
    assert time.monotonic() - start < 25  # far less than the 30 s it would have measured


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:²", "10.0.0.1:5000", "unix:"])
def test_serve_refuses_a_bad_listen_address(capsys, address):
    code, err = run_main(capsys, "serve", "--listen", address)
    assert_one_line(code, err, "--listen")


def test_serve_with_a_pipelines_path_that_is_a_folder(capsys, tmp_path):
    code, err = run_main(
        capsys, "serve", "--pipelines", str(tmp_path), "--listen", f"unix://{tmp_path}/s.sock"
    )
    assert_one_line(code, err, str(tmp_path))


@pytest.mark.parametrize(
    "args",
    [
        ["info", "x", "--timeout-s", "nan"],
        ["info", "x", "--timeout-s", "-1"],
        ["bench", "x.toml", "--rounds", "0"],
    ],
)
def test_numbers_out_of_range_are_refused_by_the_parser(capsys, args):
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    assert e.value.code == 2 and "must be a positive number" in capsys.readouterr().err


def test_a_bad_named_pipeline_says_its_value_once(capsys, tmp_path, corpus, spm_model):
    path = tmp_path / "p.toml"
    path.write_text(
        f'[x.source]\npaths = ["{corpus}"]\n[x.tokenizer]\nmodel = "{spm_model}"\n'
        '[x.batch]\npacking = "best"\n'
    )
    code, err = run_main(
        capsys, "serve", "--pipelines", str(path), "--listen", f"unix://{tmp_path}/s.sock"
    )
    assert_one_line(code, err, "`x.batch.packing`")
    assert err.count("got 'best'") == 1, err


def test_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for verb in ("serve", "demo", "info", "tune", "bench", "tokenizer"):
        assert verb in out.split("positional arguments")[0], (verb, out)


# --- tokenizer train --------------------------------------------------------------------------


@pytest.fixture
def small_corpus(tmp_path, docs):
    from input_server.data.builtin_corpora import write_jsonl

    return write_jsonl(docs[:300], tmp_path / "c.jsonl")


@pytest.mark.parametrize(
    "args, words",
    [
        (["{tmp}/missing.jsonl"], ["missing.jsonl", "no such file"]),
        (["{corpus}", "--text-field", "body"], ["line 1", "no field 'body'", "id, text"]),
        (["{corpus}", "--vocab-size", "100000"], ["--vocab-size 100000", "at most"]),
        (["{corpus}", "--vocab-size", "20"], ["--vocab-size 20 is too small", "at least"]),
        (
            ["{corpus}", "--format", "text", "--text-field", "x", "-o", "{tmp}/no/m.model"],
            ["no such folder"],
        ),
        (["{tmp}/notjson.jsonl"], ["notjson.jsonl line 2", "not valid JSON", "--format text"]),
        (["{tmp}/empty.jsonl"], ["no text in"]),
        (["{corpus}", "-o", "{corpus}"], ["is one of the corpus files"]),
    ],
    ids=[
        "missing",
        "field",
        "vocab-too-large",
        "vocab-too-small",
        "no-folder",
        "not-json",
        "empty",
        "over-the-corpus",
    ],
)
def test_tokenizer_train_mistakes(capsys, tmp_path, small_corpus, args, words):
    (tmp_path / "notjson.jsonl").write_text('{"text": "fine"}\nnot json at all\n')
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n\n')
    args = [a.format(tmp=tmp_path, corpus=small_corpus) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "m.model")]
    before = pathlib.Path(small_corpus).read_bytes()
    code, err = run_main(capsys, "tokenizer", "train", *args)
    assert_one_line(code, err, *words)
    assert not (tmp_path / "m.model").exists()
    assert pathlib.Path(small_corpus).read_bytes() == before  # the data is never touched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".spm-")] == []
