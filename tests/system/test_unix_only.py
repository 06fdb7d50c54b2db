"""On a host that refuses TCP and UDP (the TPU hosts: gVisor, Unix sockets only) every command a
user runs works over Unix sockets, and what needs TCP says so in one line. The host is stood in
for by a seccomp filter (input_server.testing.no_inet) that the kernel applies to the command
and every process it starts, gRPC's C core included."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from input_server.testing import no_inet
from tests.support import ChildProcess, cli_argv

REFUSED = "this host refuses TCP sockets (Address family not supported by protocol)"


def run(*command: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """`command` under the filter, to its end: its output as text (gRPC's core can log
    bytes that are not UTF-8 when it fails to bind)."""
    return subprocess.run(
        no_inet.argv(*command),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        **kwargs,
    )


@pytest.fixture(scope="module", autouse=True)
def _filter_installs():
    out = run(sys.executable, "-c", "pass", timeout=60)
    if out.returncode == 3:  # the stand-in's own refusal: it says why
        if os.environ.get("CI"):  # CI can install it: these tests must not vanish there
            pytest.fail(f"the no-TCP stand-in cannot be installed in CI: {out.stderr.strip()}")
        pytest.skip(out.stderr.strip())


@pytest.fixture
def spec_file(tmp_path, corpus, spm_model) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(
        f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nmodel = "{spm_model}"\n'
        "[batch]\nseq_len = 128\nsize = 4\n[workers]\ncount = 0\n"
    )
    return str(path)


def test_the_stand_in_refuses_ip_sockets_down_to_grpc_core_and_leaves_unix_ones():
    probe = textwrap.dedent(
        """
        import socket, subprocess, sys
        import grpc
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                socket.socket(family, socket.SOCK_DGRAM)
            except OSError as e:
                print("refused", family.name, e.errno)
        socket.socket(socket.AF_UNIX).close()
        print("unix ok")
        server = grpc.server(None)
        try:
            print("grpc bound", server.add_insecure_port("127.0.0.1:0"))
        except RuntimeError:
            print("grpc refused")
        child = "import socket; socket.socket()"
        print("child", subprocess.run([sys.executable, "-c", child]).returncode)
        """
    )
    out = run(sys.executable, "-c", probe)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == ["refused AF_INET 97", "refused AF_INET6 97", "unix ok"], lines
    assert lines[3:] == ["grpc refused", "child 1"], lines  # C core and children alike


@pytest.mark.parametrize(
    "flags, way_out",
    [
        (("--metrics-port", "9100"), "leave out --metrics-port and read the same figures with"),
        (("--metrics-port", "0"), "`input-server info` or `input-server stats`"),
        (("--health-port", "0"), "leave out --health-port"),
        (("--listen", "127.0.0.1:0", "--insecure-tcp"), "listen on a Unix socket instead"),
    ],
    ids=["metrics-port", "metrics-port-0", "health-port", "listen-tcp"],
)
def test_what_needs_tcp_refuses_in_one_line(short_tmp, flags, way_out):
    unix = f"unix://{short_tmp}/s.sock"
    listen = () if "--listen" in flags else ("--listen", unix)
    out = run(*cli_argv("serve", *listen, *flags), timeout=60)
    assert out.returncode != 0 and out.stdout == ""
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err  # gRPC's core logs none
    assert err.startswith(f"input-server: {flags[0]} ") and REFUSED in err and way_out in err, err
    # The Unix socket it bound first is gone; its lock file stays (`serving/socket_lock.py`).
    assert os.listdir(short_tmp) == (["s.sock.lock"] if listen else [])


CLIENT = """
import subprocess, sys
from input_client import InputClient, PipelineSpec
from input_server.testing.processes import cli_argv
target, spec = sys.argv[1], PipelineSpec.from_toml(sys.argv[2])
with InputClient(target, connect_timeout_s=60) as client, client.batches(spec) as it:
    batches = [next(it) for _ in range(3)]
    print("batches", len(batches), batches[-1]["inputs"].shape)
    for verb in ("info", "stats"):  # while the stream is open
        done = subprocess.run(cli_argv(verb, target), capture_output=True, text=True)
        print(f"--- {verb} {done.returncode} {done.stderr.strip()}")
        print(done.stdout)
"""


def test_serve_a_client_stream_info_and_stats_work_over_a_unix_socket(
    short_tmp, corpus, spm_model, spec_file
):
    target = f"unix://{short_tmp}/s.sock"
    roots = {os.path.dirname(corpus), os.path.dirname(spm_model)}
    argv = cli_argv("serve", "--listen", target, *(f"--data-root={r}" for r in roots))
    server = ChildProcess(no_inet.argv(*argv), log=str(short_tmp / "serve.log"), read_lines=True)
    try:
        line = server.lines.get(timeout=60)
        assert line and "serving on" in line, open(short_tmp / "serve.log").read()
        out = run(sys.executable, "-c", CLIENT, target, spec_file)
    finally:
        server.kill()
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "batches 3 (4, 128)" in text, text
    info = text.split("--- info 0 \n", 1)[1].split("--- stats", 1)[0]
    assert f"address    {target}" in info and "streams    1 running" in info, text
    stats = text.split("--- stats 0 \n", 1)[1]
    assert stats.startswith(f"server {target}: 1 ") and "\nstream 1  request: " in stats, text


def test_tune_measures_and_chooses(tmp_path, spec_file):
    out = run(
        *cli_argv("tune", spec_file, "--max-workers", "2", "--tune-seconds", "4"),
        cwd=tmp_path,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "choice: " in out.stdout, out.stdout


def test_demo_trains_through_its_unix_socket(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("XLA_FLAGS", None)
    demo = cli_argv("demo", "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--no-progress")
    out = run(*demo, cwd=tmp_path, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"steps timed +2 \(1 excluded\)", out.stdout), out.stdout


def test_bench_skips_the_tcp_row_saying_why_and_keeps_every_other(tmp_path, spec_file):
    out_json = tmp_path / "bench.json"
    bench = cli_argv(
        "bench", spec_file, "--min-tokens", "30000", "--rounds", "1",
        "--reference-processes", "0", "--json", str(out_json),
    )  # fmt: skip
    out = run(*bench, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out_json.read_text())
    assert result["server"]["tcp"] == {"skipped": f"{REFUSED}; served over the Unix socket only"}
    for row in (
        result["limit"],
        result["reference"]["0"],
        result["pipeline_in_process"],
        result["server"]["unix"],
    ):
        assert row["tokens_per_s"] > 0, row
    assert result["ratios"]["server_unix_over_in_process"] > 0
    assert "server_tcp_over_in_process" not in result["ratios"]
    assert result["packing_same_order"]["ours"] > 0
    table = out.stdout
    assert f"through server + client, tcp               skipped: {REFUSED}" in table, table
    assert "through server + client, unix" in table
