"""Servers and other commands in child processes, as tests and scripts start them: the CLI by
this interpreter, a process group one SIGKILL ends, a restartable server, a token file, a fake
servicer, health, a memory cgroup, another Python."""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

# The folder that holds this `input_server` (a checkout's root, when installed editable).
TREE = pathlib.Path(__file__).resolve().parents[2]


def cli_argv(*args: str) -> list[str]:
    """`input-server ARGS` run by this interpreter: no installed entry point needed."""
    return [sys.executable, "-m", "input_server.cli", *args]


def free_port() -> int:
    """A loopback TCP port free now, for servers that must restart on the same address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChildProcess:
    """A command in its own process group, so one SIGKILL takes its worker processes too (as
    when a host or container goes). Its stderr (and stdout unless `read_lines`) goes to `log`;
    with `read_lines`, its stdout lines arrive in `lines`, None once it closed."""

    def __init__(
        self,
        argv: list[str],
        *,
        log: str,
        read_lines: bool = False,
        env: dict[str, str] | None = None,
    ):
        self._log = open(log, "ab")  # noqa: SIM115 - closed in kill()
        self.p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if read_lines else self._log,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=read_lines,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        if read_lines:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group, even if its leader is gone
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(timeout=30)
        self._log.close()


class ServerProcess:
    """`input-server serve` as a `ChildProcess` that can be SIGKILLed and started again on the
    same address, its output appended to one log. With `token_file`, its TCP and abstract
    listeners need that file's token (`InputClient(..., token_file=...)`)."""

    def __init__(
        self,
        address: str,
        log_path: str,
        token_file: str | None = None,
        data_root: str | None = None,
        args: Sequence[str] = (),
    ):
        self.address, self.log_path, self.token_file = address, log_path, token_file
        self.data_root = data_root  # default its working directory, this one's
        self.args = tuple(args)  # more `serve` flags
        self.child: ChildProcess | None = None

    def start(self) -> None:
        token = ("--token-file", self.token_file) if self.token_file else ()
        root = ("--data-root", self.data_root) if self.data_root else ()
        self.child = ChildProcess(
            cli_argv("serve", "--listen", self.address, *token, *root, *self.args),
            log=self.log_path,
        )

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()


def write_token_file(directory) -> tuple[str, str]:
    """A new random token in `directory`/token, mode 0600 from its creation; (path, token)."""
    import secrets

    token = secrets.token_hex(16)
    path = os.path.join(str(directory), "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path, token


@contextlib.contextmanager
def serve_servicer(servicer, address: str) -> Iterator[None]:
    """A gRPC server running `servicer` (a fake or a proxy) on `address` until the block ends."""
    from concurrent import futures

    import grpc

    from input_client.proto import pb_grpc
    from input_client.wire import MESSAGE_OPTIONS

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=MESSAGE_OPTIONS)
    pb_grpc.add_InputServiceServicer_to_server(servicer, server)
    server.add_insecure_port(address)
    server.start()
    try:
        yield
    finally:
        server.stop(None)


def health(target: str, service: str = "input_server.v1.InputService") -> int:
    """The health status the server reports for `service` ("" = the whole server)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as ch:  # no token: health is open to probes
        return (
            health_pb2_grpc.HealthStub(ch)
            .Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            .status
        )


_CGROUP_NUMBERS = itertools.count()


@contextlib.contextmanager
def memory_cgroup(gb: float):
    """A memory cgroup of `gb` GB to put a server in (its `cgroup.procs` path: write a child's
    pid there, as `preexec_fn`, before it execs), or None where none can be made. Tests that
    could allocate gigabytes run their server in one, so a failure kills it, not the host."""
    name = f"input-server-{os.getpid()}-{next(_CGROUP_NUMBERS)}"
    for base, limit_file, procs in [
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "cgroup.procs"),  # v1
        ("/sys/fs/cgroup", "memory.max", "cgroup.procs"),  # v2
    ]:
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(int(gb * (1 << 30))))
            yield os.path.join(path, procs)
            return
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(path)
    yield None


@contextlib.contextmanager
def cgroup_server(
    root: str, *flags: str, procs: str | None = None, prefix=(), log: str | None = None
):
    """`input-server serve FLAGS` reading `root`, on a Unix socket there, started inside the
    memory cgroup whose `procs` file `memory_cgroup` gave (None: in none) and serving: its
    target and process, stopped when the block ends. It runs the code of this module's tree
    (`TREE`), whatever is installed; its output goes to `log` (appended) or nowhere; `prefix`
    goes before its argv (`prlimit ...`)."""
    import grpc

    target = f"unix://{root}/s.sock"
    argv = [*prefix, *cli_argv("serve", "--listen", target, "--data-root", root, *flags)]

    def enter_cgroup() -> None:  # in the child, before it execs: all it starts is inside
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    path = os.pathsep.join(p for p in (str(TREE), os.environ.get("PYTHONPATH")) if p)
    with open(log or os.devnull, "ab") as out:
        p = subprocess.Popen(
            argv,
            stdout=out,
            stderr=out,
            preexec_fn=enter_cgroup if procs else None,
            env={**os.environ, "PYTHONPATH": path},
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(grpc.RpcError):
                if health(target) == 1:
                    break
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.2)
        yield target, p
    finally:
        p.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)
        p.kill()
        p.wait()


def find_python(version: str) -> str | None:
    """An interpreter of `version` ("3.12"): pyenv's, else one on PATH that runs (pyenv's shims
    answer for versions that are not selected)."""
    import glob
    import shutil

    candidates = sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}"))
    )
    found = shutil.which(f"python{version}")
    for candidate in [*candidates, *([found] if found else [])]:
        if subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None
