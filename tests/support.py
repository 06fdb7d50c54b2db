"""Helpers shared by the tests (and scripts/chaos.py): paths, pipelines run in process, batch
comparisons, child processes, fake servers, documents in every file format.

Imports of the heavy packages (Grain, grpc, pyarrow, ...) are lazy: chaos.py's trainer, a
client-only process, imports this module too.
"""

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

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def script(name: str) -> str:
    """The absolute path of scripts/NAME, so script tests pass from any working folder."""
    return str(SCRIPTS / name)


def cli_argv(*args: str) -> list[str]:
    """`input-server ARGS` run by this interpreter: no installed entry point needed."""
    return [sys.executable, "-m", "input_server.cli", *args]


# --- Pipelines run in process, and comparing their batches --------------------------------------


def run_pipeline(
    spec_or_pipeline, state=None, *, processes: int = 0, threads: int = 2, limit: int | None = None
) -> list:
    """The stream with no server in between (`Produced` items): what a served stream must equal."""
    from itertools import islice

    from input_server.batching.pipeline import Pipeline, Workers

    pipeline = (
        spec_or_pipeline if isinstance(spec_or_pipeline, Pipeline) else Pipeline(spec_or_pipeline)
    )
    with pipeline.stream(state, workers=Workers(processes, threads, "test")) as stream:
        return list(islice(stream, limit))


def batch_bytes(batch) -> bytes:
    """A batch's arrays in name order as bytes: what chaos.py's trainer logs and compares."""
    import numpy as np

    return b"".join(np.ascontiguousarray(np.asarray(batch[k])).tobytes() for k in sorted(batch))


def _same_batch(a, b) -> bool:
    """One batch against another: bytes (`batch_bytes`), a client's dict or a `Produced`."""
    import numpy as np

    from input_client.wire import FIELDS

    if isinstance(a, bytes) or isinstance(b, bytes):
        return (a if isinstance(a, bytes) else batch_bytes(getattr(a, "arrays", a))) == (
            b if isinstance(b, bytes) else batch_bytes(getattr(b, "arrays", b))
        )
    if hasattr(a, "seq") and hasattr(b, "seq") and a.seq != b.seq:
        return False
    a, b = getattr(a, "arrays", a), getattr(b, "arrays", b)
    if not sorted(a) == sorted(b) == sorted(FIELDS):
        return False
    for k in FIELDS:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def first_difference(got: Sequence, want: Sequence) -> int | None:
    """The index of the first batch that differs (or that one list lacks); None if all agree."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if not _same_batch(g, w):
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def same_batches(got: Sequence, want: Sequence) -> bool:
    """Batch for batch the same arrays (dtype, shape, bytes; and sequence numbers where known)."""
    return first_difference(got, want) is None


def assert_same_batches(got: Sequence, want: Sequence) -> None:
    """`same_batches`, failing with the first batch that differs rather than a bare False."""
    i = first_difference(got, want)
    assert i is None, (
        f"batch {i} differs from the reference (or is missing): "
        f"{len(got)} batches against {len(want)}"
    )


# --- Child processes ------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback TCP port free now, for servers that must restart on the same address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_processes(exclude: set[int] = frozenset()) -> list:
    """Live child processes of this one (Grain's workers), but `exclude` and multiprocessing's
    resource tracker (started once for shared memory, it lives as long as this process)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (
                p.pid not in exclude
                and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())
            ):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def still_running(processes) -> list:
    """Those of `processes` not yet gone (a zombie, waiting to be reaped, counts as gone)."""
    import psutil

    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


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


def serve_cli(
    *args: str, log: str, env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[ChildProcess, list[str]]:
    """`input-server serve ARGS` started and serving: the process and the targets it printed.
    The caller kills it (`ChildProcess.kill`)."""
    child = ChildProcess(cli_argv("serve", *args), log=log, read_lines=True, env=env)
    try:
        line = child.lines.get(timeout=timeout)
    except queue.Empty:
        line = None
    if not line or "serving on" not in line:
        child.kill()
        with open(log) as f:
            raise AssertionError(f"serve {args} did not start: {f.read()[-2000:]}")
    return child, line.split("serving on ", 1)[1].split()


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


# --- Tokens: TCP and abstract listeners need one ------------------------------------------------

# The tokens of the servers tests started, by target: the helpers below send a target's token.
TOKENS: dict[str, str] = {}


def write_token_file(directory) -> tuple[str, str]:
    """A new random token in `directory`/token, mode 0600 from its creation; (path, token)."""
    import secrets

    token = secrets.token_hex(16)
    path = os.path.join(str(directory), "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path, token


def dial(target: str, token: str | None = None, options=()):
    """A raw gRPC channel to `target`, sending `token` (default the target's in `TOKENS`)."""
    import grpc

    from input_client.auth import TokenInterceptor

    channel = grpc.insecure_channel(target, options=list(options))
    token = TOKENS.get(target) if token is None else token
    return grpc.intercept_channel(channel, TokenInterceptor(token)) if token else channel


# --- Talking to servers, real and fake ------------------------------------------------------------


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


def raw_messages(target: str, spec, pause_s: float = 0.0, token: str | None = None) -> list:
    """A stream's messages as they arrive on the wire (no client iterator in between, and no
    client-side validation of a proto `spec`); after the first, waits `pause_s` so that the
    server's queue fills. Sends `token` (default the target's in `TOKENS`)."""
    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    spec = spec if isinstance(spec, pb.PipelineSpec) else spec.to_proto()
    with dial(target, token) as channel:
        call = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)])
        )
        messages = [next(call)]
        time.sleep(pause_s)
        messages += list(call)
    return messages


def stream_status(target: str, spec, take: int | None = None, timeout: float = 60) -> tuple:
    """(status, details, messages read) of a raw StreamBatches request of `spec` (a proto):
    read to its end, or cancelled (OK) once `take` messages came."""
    import grpc

    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    with grpc.insecure_channel(target) as channel:
        stream = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
            timeout=timeout,
        )
        n = 0
        try:
            for _ in stream:
                n += 1
                if take is not None and n >= take:
                    stream.cancel()
                    return grpc.StatusCode.OK, "", n
        except grpc.RpcError as e:
            return e.code(), e.details(), n
        return grpc.StatusCode.OK, "", n


@contextlib.contextmanager
def flowing_stream(target: str, spec, timeout: float = 60) -> Iterator[list]:
    """Another client's raw stream of `spec` (a proto), read in a thread while the block runs:
    the list its messages' arrival times are appended to (it stops growing if the stream
    fails). Cancelled at its next message once the block ends."""
    import grpc

    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    flowing, stop = [], threading.Event()

    def read() -> None:
        with grpc.insecure_channel(target) as channel:
            stream = pb_grpc.InputServiceStub(channel).StreamBatches(
                iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
                timeout=timeout,
            )
            with contextlib.suppress(grpc.RpcError):
                for _ in stream:
                    flowing.append(time.monotonic())
                    if stop.is_set():
                        stream.cancel()
                        return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield flowing
    finally:
        stop.set()
        thread.join(30)


# --- The same documents in every file format the server reads ------------------------------------


def jsonl_bytes(docs, field="text", decoy=False, newline="\n") -> bytes:
    """One JSON object per line; `decoy` adds a wrong "text" beside `field` to catch mix-ups."""
    import json

    lines = []
    for i, doc in enumerate(docs):
        obj = {"id": i, field: doc}
        if decoy:
            obj["text"] = f"decoy {i}"
        lines.append(json.dumps(obj))
    return "".join(line + newline for line in lines).encode()


def write_bytes(path, data: bytes) -> str:
    """Writes `data` to `path`; returns the path as a string, as specs hold it."""
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def write_arrayrecord(path, records) -> str:
    """An ArrayRecord file of `records` (bytes), one a group so any record is read alone."""
    from array_record.python import array_record_module

    w = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for r in records:
        w.write(r)
    w.close()
    return str(path)


def example_bytes(doc: str, field="text", decoy=False) -> bytes:
    """A serialized tf.train.Example holding `doc` in `field` (and a decoy "text")."""
    from input_server import tf_example_pb2

    ex = tf_example_pb2.Example()
    ex.features.feature[field].bytes_list.value.append(doc.encode())
    if decoy:
        ex.features.feature["text"].bytes_list.value.append(b"decoy")
    return ex.SerializeToString()


def write_parquet(path, docs, field="text", decoy=False, row_group_size=64) -> str:
    """A Parquet file of `docs` in several row groups (and a decoy "text" column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {"id": list(range(len(docs))), field: list(docs)}
    if decoy:
        columns["text"] = [f"decoy {i}" for i in range(len(docs))]
    pq.write_table(pa.table(columns), str(path), row_group_size=row_group_size)
    return str(path)


def zst_multiframe(data: bytes) -> bytes:
    """Several concatenated zstd frames, as `cat a.zst b.zst` or pzstd produce."""
    import zstandard

    c = zstandard.ZstdCompressor()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    return b"".join(c.compress(data[a:b]) for a, b in zip(cut, cut[1:], strict=False))


def _tfrecord(path, records) -> str:
    from input_server.data.tfrecord import write_tfrecord

    write_tfrecord(path, records)
    return str(path)


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


# kind -> (file name, writer(docs, path) -> path, source keys besides paths)
FORMATS = {
    "jsonl-plain": ("d.jsonl", lambda docs, p: write_bytes(p, jsonl_bytes(docs)), {}),
    "jsonl-gz-text_field-body": (
        "d.jsonl.gz",
        lambda docs, p: write_bytes(p, _gzip(jsonl_bytes(docs, "body", decoy=True))),
        {"text_field": "body"},
    ),
    "jsonl-zst": ("d.jsonl.zst", lambda docs, p: write_bytes(p, _zstd(jsonl_bytes(docs))), {}),
    "jsonl-zst-multiframe": (
        "d.jsonl.zst",
        lambda docs, p: write_bytes(p, zst_multiframe(jsonl_bytes(docs))),
        {},
    ),
    "arrayrecord-json-text_field-body": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, jsonl_bytes(docs, "body", decoy=True).splitlines()),
        {"format": "arrayrecord", "record_format": "json", "text_field": "body"},
    ),
    "arrayrecord-text": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [d.encode() for d in docs]),
        {"format": "arrayrecord", "record_format": "text"},
    ),
    "arrayrecord-tf_example": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [example_bytes(d) for d in docs]),
        {"format": "arrayrecord", "record_format": "tf_example"},
    ),
    "arrayrecord-tf_example-text_field-body": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [example_bytes(d, "body", True) for d in docs]),
        {"format": "arrayrecord", "record_format": "tf_example", "text_field": "body"},
    ),
    "tfrecord-text_field-body": (
        "d.tfrecord",
        lambda docs, p: _tfrecord(p, [example_bytes(d, "body", True) for d in docs]),
        {"format": "tfrecord", "text_field": "body"},
    ),
    "parquet-row-groups": (
        "d.parquet",
        lambda docs, p: write_parquet(p, docs),
        {"format": "parquet"},
    ),
    "parquet-text_field-body": (
        "d.parquet",
        lambda docs, p: write_parquet(p, docs, "body", decoy=True),
        {"format": "parquet", "text_field": "body"},
    ),
}


def write_format(kind, docs, directory) -> tuple[str, dict]:
    """Writes `docs` as `kind` in `directory`; returns the path and the spec's source table."""
    name, write, keys = FORMATS[kind]
    os.makedirs(directory, exist_ok=True)
    path = write(docs, os.path.join(directory, name))
    return path, {"paths": [path], **keys}


def split3(docs) -> list:
    """The documents in three consecutive parts (for tests of many files)."""
    k = len(docs) // 3
    return [docs[:k], docs[k : 2 * k], docs[2 * k :]]


# --- A CLI verb's mistakes: one line, exit 2 --------------------------------------------------


def run_main(capsys, *args: str) -> tuple[int, str]:
    """`input-server ARGS` in this process: its exit code and what it wrote to stderr."""
    from input_server import cli

    code = cli.main(list(args))
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, *needles: str) -> None:
    """Exit 2 with one `input-server: ...` line on stderr holding each needle, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("input-server: "), err
    for needle in needles:
        assert needle in lines[0], (needle, err)


def consume_until(
    it, client, done, *, pace: float = 0.0, timeout: float = 40.0, into: list | None = None
):
    """Takes batches from `it` (at `pace` a second; 0 = as fast as they come) until
    `done(stream_info)` holds for the one stream the server runs, checked twice a second.

    An "auto" stream tunes only while its loop takes batches, so a test waiting for its
    tuning keeps taking them. Returns the last StreamInfo; the batches go into `into`.
    """
    deadline = time.monotonic() + timeout
    checked = 0.0
    while True:
        batch = next(it)
        if into is not None:
            into.append(batch)
        if pace:
            time.sleep(1 / pace)
        if time.monotonic() - checked >= 0.5:
            checked = time.monotonic()
            (stream,) = client.info().streams
            if done(stream):
                return stream
            assert checked < deadline, f"not reached in {timeout} s: {stream}"


# --- Other Pythons and real MaxText ---------------------------------------------------------------


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


def python_or_skip(version: str, why: str) -> str:
    """`find_python(version)`; without it, a skip here and a failure in CI (which has it)."""
    import pytest

    found = find_python(version)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"Python {version} is not installed; CI needs it for {why}.")
        pytest.skip(f"Python {version} is not installed here ({why})")
    return found


# The tiny decoder of the MaxText tests and benchmark (MaxText's own flags), on one CPU device.
TINY_MAXTEXT = [
    "vocab_size=8192",
    "base_emb_dim=64",
    "base_num_decoder_layers=2",
    "base_num_query_heads=4",
    "base_num_kv_heads=4",
    "head_dim=16",
    "base_mlp_dim=256",
    "hardware=cpu",
    "attention=dot_product",
    "log_config=false",
    "enable_tensorboard=false",
]


def clean_copy(source, destination) -> pathlib.Path:
    """`source` copied without git's, builds' and caches' folders: what a fresh clone has, so a
    package built from it cannot take stale files from an earlier `build/`."""
    import shutil

    shutil.copytree(
        source,
        destination,
        ignore=shutil.ignore_patterns(
            ".git",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".pytest_cache",
            ".ruff_cache",
            ".venv",
        ),
    )
    return pathlib.Path(destination)


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
    target and process, stopped when the block ends. It runs this checkout's code, whatever is
    installed; its output goes to `log` (appended) or nowhere; `prefix` goes before its argv
    (`prlimit ...`)."""
    import grpc

    target = f"unix://{root}/s.sock"
    argv = [*prefix, *cli_argv("serve", "--listen", target, "--data-root", root, *flags)]

    def enter_cgroup() -> None:  # in the child, before it execs: all it starts is inside
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
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
                raise AssertionError("the server did not start")
            time.sleep(0.2)
        yield target, p
    finally:
        p.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)
        p.kill()
        p.wait()
