"""A client's text reaches no output raw (issue 39 item 5): a real `input-server -v serve`
streams a glob that still matches its file while holding a newline, an ESC, U+2028, U+2029
and NEL; its text log stays one line per record, its JSON log holds none of them raw, and
GetInfo, `input-server info` and `stats` show the label escaped."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

import grpc
import pytest

from input_client import InputClient
from input_client.spec import PipelineSpec
from input_server import cli
from tests.support import ChildProcess, cli_argv, flowing_stream, stream_status

# The class holds `l` (so it matches docs.jsonl) and what a forger would put in a log.
HOSTILE = "docs.json[l\nI1206 FAKE-LOG-LINE \x1b[31m\u2028\u2029\x85]"
ESCAPED = r"docs.json[l\nI1206 FAKE-LOG-LINE \x1b[31m\u2028\u2029\x85]"
RAW = ("\x1b", "\u2028", "\u2029", "\x85", "\r")
RECORD_HEAD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) ")


def _serve(folder, fmt: str, roots) -> tuple[ChildProcess, str, str]:
    sock, log = f"unix://{folder}/s.sock", str(folder / "serve.log")
    argv = cli_argv("-v", "serve", "--listen", sock, "--log-format", fmt)
    roots_args = [a for r in roots for a in ("--data-root", r)]
    child = ChildProcess([*argv, *roots_args], log=log, read_lines=True)
    line = child.lines.get(timeout=60) or ""
    assert "serving on" in line, open(log).read()[-2000:]
    return child, sock, log


def _cli(capsys, *args: str) -> str:
    """What `input-server ARGS`, run in this process, printed; it must succeed."""
    capsys.readouterr()
    assert cli.main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_hostile_glob_is_escaped_in_the_log_info_and_stats(
    tmp_path, short_tmp, corpus, spm_model, capsys, fmt
):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(corpus, data / "docs.jsonl")
    spec = PipelineSpec(
        source={"paths": [str(data / HOSTILE)]},
        tokenizer={"model": spm_model},
        batch={"seq_len": 128, "size": 4},
        order={"epochs": 0},
        workers={"count": 0},
    )
    roots = [str(data), os.path.dirname(spm_model)]
    child, sock, log = _serve(short_tmp, fmt, roots)
    try:
        with flowing_stream(sock, spec.to_proto()) as arrived, InputClient(sock) as client:
            deadline = time.monotonic() + 15
            while not arrived and time.monotonic() < deadline:
                time.sleep(0.05)
            assert arrived, open(log).read()[-2000:]
            info = client.info()
            table, stats = _cli(capsys, "info", sock), _cli(capsys, "stats", sock)
        # Another path a client wrote, refused (its status goes to its sender alone).
        missing = spec.replace(source={"paths": [str(data / "no\nI1206 FAKE\x1b.jsonl")]})
        assert stream_status(sock, missing.to_proto())[0] == grpc.StatusCode.NOT_FOUND
        time.sleep(0.5)  # a stream's end is logged as it closes
        child.p.send_signal(signal.SIGTERM)
        assert child.p.wait(timeout=30) == 0
    finally:
        child.kill()

    label = f"request: {ESCAPED}, {os.path.basename(spm_model)}"
    assert [s.pipeline for s in info.streams] == [label]
    assert label in stats and label[:31] in table, (stats, table)  # the table cuts at 32
    for shown in (table, stats):
        assert not any(c in shown for c in RAW) and "\nI1206" not in shown, shown

    with open(log, encoding="utf-8", newline="") as f:
        text = f.read()
    assert not any(c in text for c in RAW), [c for c in RAW if c in text]
    # splitlines() also splits at U+2028, U+2029, NEL and \r, as line splitters do.
    lines = [line for line in text.splitlines() if line.strip()]
    if fmt == "text":
        strays = [line for line in lines if not RECORD_HEAD.match(line)]
        assert not strays, strays  # one line per record: no line a client started
        opened = [line for line in lines if "worker processes" in line]
        assert len(opened) == 1 and label in opened[0], opened
    else:
        records = [json.loads(line) for line in lines]  # each line one whole record
        opened = [r for r in records if r.get("event") == "stream_open"]
        assert [r["pipeline"] for r in opened] == [label], opened
        assert label in opened[0]["message"]
