"""Every bind failure of `serve` is one line with the way out, and no line of gRPC's C core
(issue 40, item 4).

Before: a TCP port in use printed gRPC core's `E1206 ... add_port.cc:83] Failed to add port ...`
and then "cannot bind (... set GRPC_VERBOSITY=debug ...)"; a socket in a missing folder the
same. Each case here runs the real `input-server serve` against a real socket held by another
process (or a real folder), and reads its stderr whole.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from input_server.serving.server import Server, ServerConfig
from input_server.testing.processes import cli_argv
from tests.support.netns import hosts_or_skip

# A line of gRPC's C core (absl's log format): "E1206 13:49:36.460897   23827 add_port.cc:83] ...".
CORE_LINE = re.compile(r"^[EIWF]\d{4} ", re.M)


def serve(*args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """`input-server serve ARGS` run to its exit (a bind failure exits at once)."""
    return subprocess.run(
        [*(prefix or []), *cli_argv("serve", *args)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line(done: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, stderr one `input-server:` line holding each needle, and no C-core line."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert not CORE_LINE.search(done.stderr), done.stderr
    assert "GRPC_VERBOSITY" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("input-server: "), done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def short_dir():
    """A folder with a short path: a Unix socket path holds 107 bytes."""
    folder = tempfile.mkdtemp(prefix="bind-", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_tcp_port_in_use_is_one_line_naming_the_port_and_the_fix():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = serve("--listen", f"127.0.0.1:{port}", "--insecure-tcp")
    assert_one_line(done, f"127.0.0.1:{port}", f"port {port} is in use", "choose another port")


def test_a_socket_path_already_served_is_one_line_and_the_server_keeps_it(short_dir):
    target = f"unix://{short_dir}/s.sock"
    with Server(ServerConfig(listen=[target])):
        done = serve("--listen", target)
        assert os.path.exists(f"{short_dir}/s.sock")  # the live server's socket stays
    assert_one_line(done, target, "in use by a running server", "listen on another path")


def test_a_socket_in_a_missing_folder_is_one_line_with_mkdir(short_dir):
    folder = f"{short_dir}/not/there"
    done = serve("--listen", f"unix://{folder}/s.sock")
    assert_one_line(done, f"the folder {folder} does not exist", f"mkdir -p {folder}")


def test_a_socket_in_a_folder_not_writable_is_one_line(short_dir):
    folder = f"{short_dir}/ro"
    os.mkdir(folder, 0o500)
    prefix = None
    if os.geteuid() == 0:  # root writes anywhere: drop the capabilities that let it
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: cannot make a folder root may not write to")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    done = serve("--listen", f"unix://{folder}/s.sock", prefix=prefix)
    assert_one_line(done, f"may not create files in {folder}", "choose a folder of yours")


def test_a_library_server_on_a_port_in_use_raises_one_line_and_writes_nothing(capfd):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError) as e:
            Server(ServerConfig(listen=[f"127.0.0.1:{port}"], insecure_tcp=True))
    assert f"port {port} is in use" in str(e.value) and "\n" not in str(e.value)
    err = capfd.readouterr().err
    assert not CORE_LINE.search(err), err


@pytest.fixture(scope="module")
def host():
    with hosts_or_skip(1) as h:
        yield h


def test_a_health_port_in_use_on_every_interface_is_one_line(host, short_dir):
    # --health-port binds every interface: inside a namespace of the test's own.
    holder = subprocess.Popen(
        host.argv(0, [sys.executable, "-c", HOLD_PORT]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(holder.stdout.readline())
        done = serve(
            "--listen",
            f"unix://{short_dir}/s.sock",
            "--health-port",
            str(port),
            prefix=host.argv(0, []),
        )
    finally:
        holder.kill()
        holder.wait()
    assert_one_line(done, f"--health-port {port}", f"port {port} is in use")


# Holds a port on every interface (IPv4 and IPv6) and prints it.
HOLD_PORT = """
import socket, sys, time
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""
