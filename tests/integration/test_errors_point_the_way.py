"""Errors that point the way, one line each (issue 51, item 2).

Before: a folder where a file is expected was PERMISSION_DENIED ("not a regular file"), a
spec mistake caught in the client was a long traceback that did not name the spec file, a
socket file left by a killed server was 31 s of silence, and `info`/`stats` took 10 s to say
an address does not answer. Real servers, real clients, real socket files.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import grpc
import pytest

from input_client import InputClient, PipelineSpec
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION
from input_server.serving.server import Server, ServerConfig
from tests.support import assert_one_line, client_warnings, run_main


def _refusal(target: str, paths: list[str], model: str, kind: str) -> tuple[grpc.StatusCode, str]:
    """(status, details) of a raw stream request: the server's refusal as any client sees it."""
    spec = PipelineSpec(
        source={"paths": paths},
        tokenizer={"model": model, "kind": kind},
        batch={"seq_len": 64, "size": 2},
        workers={"count": 0},
    ).to_proto()
    with grpc.insecure_channel(target) as channel:
        call = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
            timeout=60,
        )
        try:
            list(call)
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
def roots(tmp_path_factory, corpus, spm_model):
    """A server whose data root holds a folder of JSON lines and a Hugging Face folder."""
    top = tmp_path_factory.mktemp("folders")
    root = top / "root"
    (root / "tok").mkdir(parents=True)
    (root / "hf").mkdir()
    for i in range(3):
        shutil.copy(corpus, root / "tok" / f"part-{i}.jsonl")
    shutil.copy(spm_model, root / "spm.model")
    (root / "hf" / "tokenizer.json").write_text("{}")
    (root / "hf" / "tokenizer_config.json").write_text("{}")
    with Server(ServerConfig(listen=[f"unix://{top}/s.sock"], data_roots=[str(root)])) as srv:
        yield srv.targets[0]


def test_a_folder_as_a_source_path_is_invalid_argument_naming_a_glob_of_its_files(roots):
    code, details = _refusal(roots, ["tok"], "spm.model", "sentencepiece")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    first = details.splitlines()[0]
    assert "'tok' is a folder" in first and "'tok/*.jsonl'" in first, first
    assert "3 .jsonl" in first and "permission" not in first, first
    # Outside the roots nothing is probed: a folder there is refused as any path is.
    code, details = _refusal(roots, ["/etc"], "spm.model", "sentencepiece")
    assert code == grpc.StatusCode.PERMISSION_DENIED, (code, details)
    assert "outside the server's data roots" in details and "folder" not in details


def test_a_hugging_face_folder_given_as_sentencepiece_names_the_kind(roots):
    code, details = _refusal(roots, ["tok/*.jsonl"], "hf", "sentencepiece")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    first = details.splitlines()[0]
    assert first.startswith("`tokenizer.model`: 'hf' is a folder"), first
    assert 'kind = "huggingface"' in first, first


@pytest.fixture
def bad_spec(tmp_path, corpus, spm_model):
    path = tmp_path / "bad.toml"
    path.write_text(
        f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nmodel = "{spm_model}"\n'
        f"[batch]\nseq_len = 128\nsize = -4\n"
    )
    return str(path)


def test_a_spec_mistake_in_a_script_is_a_short_traceback_naming_the_file(bad_spec):
    script = "import sys, input_client; input_client.PipelineSpec.from_toml(sys.argv[1])"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(
        [sys.executable, "-c", script, bad_spec], capture_output=True, text=True, env=env
    )
    lines = r.stderr.strip().splitlines()
    # The script's line and `from_toml`'s, not the checks' frames.
    assert len(lines) <= 6 and "_spec_checks" not in r.stderr, r.stderr
    assert lines[-1].startswith(f"input_client.errors.SpecError: {bad_spec}: `batch.size`")
    assert "got -4" in lines[-1], lines[-1]


@pytest.mark.parametrize("verb", ["tune", "bench"])
def test_a_spec_mistake_in_a_cli_verb_is_one_line_naming_the_file(capsys, bad_spec, verb):
    code, err = run_main(capsys, verb, bad_spec)
    assert_one_line(code, err, f"input-server: {bad_spec}: `batch.size`", "got -4")


@pytest.fixture
def stale_socket(short_tmp):
    """A socket file bound and closed, nobody listening: what a killed server leaves (in a
    folder with a short path: a Unix socket path is short)."""
    path = f"{short_tmp}/s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
    return path


def test_a_stale_socket_is_said_within_a_second_and_waited_on(stale_socket):
    with client_warnings() as said:
        with InputClient(f"unix://{stale_socket}", connect_timeout_s=3) as client:
            start = time.monotonic()
            with pytest.raises(ConnectionError) as e:
                client.wait_ready()
            ended = time.monotonic() - start
    at, message = said.said.get_nowait()
    assert at - start < 1.0, (at - start, message)
    assert f"nobody answers on the socket file {stale_socket}" in message, message
    assert "waiting up to 3 s" in message, message
    assert ended >= 2.5, ended  # still waited for a server to come, to the deadline
    assert "nobody answers" in str(e.value)


@pytest.mark.parametrize("verb", ["info", "stats"])
def test_info_and_stats_on_a_stale_socket_say_so_at_once(capsys, stale_socket, verb):
    start = time.monotonic()
    code, err = run_main(capsys, verb, f"unix://{stale_socket}")
    assert time.monotonic() - start < 2.0
    assert_one_line(code, err, f"nobody answers on the socket file {stale_socket}")


@pytest.mark.parametrize("verb", ["info", "stats"])
def test_info_and_stats_on_a_refused_tcp_port_say_so_at_once(capsys, verb):
    with socket.socket() as s:  # a port just free: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    code, err = run_main(capsys, verb, f"127.0.0.1:{port}")
    assert time.monotonic() - start < 2.0
    assert_one_line(code, err, "connection refused", f"--listen 127.0.0.1:{port}")


def test_info_on_a_missing_socket_gives_up_within_two_seconds(capsys, tmp_path):
    start = time.monotonic()
    code, err = run_main(capsys, "info", f"unix://{tmp_path}/none.sock")
    assert time.monotonic() - start < 2.5  # the default connect timeout, not 10 s
    assert_one_line(code, err, f"no socket at {tmp_path}/none.sock")
