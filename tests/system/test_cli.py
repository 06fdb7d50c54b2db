"""`input-server serve` as a real process: named pipelines, info, SIGTERM, refused addresses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from input_client import InputClient
from tests.support import cli_argv, raw_messages, still_running


def start_serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        cli_argv("serve", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_named_pipeline_then_a_signal_stops_cleanly(tmp_path, corpus, spm_model, signum):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(f"""
[tiny.source]
paths = ["{corpus}"]
[tiny.tokenizer]
model = "{spm_model}"
[tiny.batch]
seq_len = 64
size = 2
[tiny.order]
epochs = 0
[tiny.workers]
count = 1
""")
    sock = tmp_path / "serve.sock"
    proc = start_serve("--listen", f"unix://{sock}", "--pipelines", str(pipelines))
    try:
        with InputClient(f"unix://{sock}", connect_timeout_s=60) as client:
            it = client.batches("tiny")
            batch = next(it)
            assert batch["inputs"].shape == (2, 64)
            info = client.info()
            assert info.streams[0].worker_processes == 1
            workers = psutil.Process(proc.pid).children(recursive=True)
            assert workers, "the stream runs a worker process"
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            it.close()
        # One line says it drained and what it ended.
        assert f"input-server: {signum.name}: drained, 1 stream ended; stopped." in out, (out, err)
        assert not sock.exists()
        time.sleep(0.5)
        assert not still_running(workers)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_info_prints_a_table_and_json_with_numbers_as_numbers(tmp_path, corpus, spm_model):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(
        f'[tiny.source]\npaths = ["{corpus}"]\n[tiny.tokenizer]\nmodel = "{spm_model}"\n'
        "[tiny.batch]\nseq_len = 64\nsize = 2\n[tiny.order]\nepochs = 0\n"
        "[tiny.workers]\ncount = 0\nthreads = 1\n"
    )
    sock = f"unix://{tmp_path}/info.sock"
    proc = start_serve("--listen", sock, "--pipelines", str(pipelines))
    try:
        with InputClient(sock, connect_timeout_s=60) as client, client.batches("tiny") as it:
            for _ in range(3):
                next(it)
            table = subprocess.run(
                cli_argv("info", sock), capture_output=True, text=True, timeout=60
            )
            as_json = subprocess.run(
                cli_argv("info", sock, "--json"), capture_output=True, text=True, timeout=60
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert table.returncode == 0 and as_json.returncode == 0, (table.stderr, as_json.stderr)
    lines = table.stdout.splitlines()
    assert lines[0].startswith("server     input-server ")
    assert lines[1] == f"address    {sock}"  # the address it used
    assert any(line.startswith("pipelines  tiny: ") and "batch 2 x 64" in line for line in lines)
    assert "streams    1 running" in lines
    row = next(line.split() for line in lines if line.split()[:2] == ["1", "tiny"])
    processes, threads, _, produced, sent, taken = row[2:8]
    assert (processes, threads) == ("0", "1") and int(sent) >= 3 and int(taken) >= 3
    info = json.loads(as_json.stdout)
    stream = info["streams"][0]
    assert isinstance(stream["batchesSent"], int) and stream["batchesSent"] >= 3
    assert stream["streamId"] == 1 and stream["workerProcesses"] == 0  # zero fields included
    assert "demandBatchesPerS" in stream and isinstance(info["protocolVersion"], int)
    assert info["pipelines"]["tiny"]["batch"]["seqLen"] == 64


@pytest.mark.parametrize(
    "args, words",
    [
        (["--listen", "0.0.0.0:5999"], ["0.0.0.0:5999", "loopback"]),
        (["--pipelines", "/no/such/pipelines.toml"], ["/no/such/pipelines.toml"]),
        (["--message-tokens", "0"], ["message_tokens", "positive", "0"]),
    ],
)
def test_serve_refuses_bad_start_with_message(args, words):
    proc = start_serve(*args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    for w in words:
        assert w in err
    assert "Traceback" not in err


def test_serve_refuses_a_bad_named_pipeline_at_start(tmp_path, corpus):
    pipelines = tmp_path / "p.toml"
    pipelines.write_text(f'[x.source]\npaths = ["{corpus}"]\n[x.tokenizer]\nmodel = "nope.model"\n')
    proc = start_serve("--listen", f"unix://{tmp_path}/x.sock", "--pipelines", str(pipelines))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert os.path.join(str(tmp_path), "nope.model") in err


def test_serve_message_tokens_reaches_the_streams(tmp_path, make_spec):
    from input_server.serving.coalesce import MESSAGE_TOKENS

    sock = f"unix://{tmp_path}/m.sock"
    proc = start_serve("--listen", sock, "--message-tokens", "128")
    try:
        InputClient(sock, connect_timeout_s=60).wait_ready()
        spec = make_spec(batch={"seq_len": 64, "size": 2})  # 128 tokens: one a message
        # The server's queue fills meanwhile: by default these would share messages.
        messages = raw_messages(sock, spec, pause_s=0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert len(messages) > 10 and not any(m.following for m in messages)
    help_text = subprocess.run(
        cli_argv("serve", "--help"), capture_output=True, text=True, timeout=60
    ).stdout
    assert f"default {MESSAGE_TOKENS}" in help_text  # the help says the real default
