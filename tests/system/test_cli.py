"""`input-server serve` as a real process: named pipelines, info, SIGTERM, refused addresses."""

from __future__ import annotations

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


def test_serve_named_pipeline_then_sigterm_stops_cleanly(tmp_path, corpus, spm_model):
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
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            it.close()
        assert not sock.exists()
        time.sleep(0.5)
        assert not still_running(workers)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_info_command_prints_server_description(tmp_path, corpus, spm_model):
    sock = tmp_path / "info.sock"
    proc = start_serve("--listen", f"unix://{sock}")
    try:
        InputClient(f"unix://{sock}", connect_timeout_s=60).wait_ready()
        out = subprocess.run(
            cli_argv("info", f"unix://{sock}"), capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert '"serverVersion"' in out.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


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
