"""Helpers shared by the tests: paths, batch comparisons, worker processes, raw calls to servers,
a CLI verb's mistakes, other Pythons. What scripts/ share with the tests (child processes,
servers in a memory cgroup, pipelines run in process, documents in every file format, the tiny
MaxText decoder) lies in the installed `input_server.testing` package; the names are
re-exported here for the tests.

Imports of the heavy packages (Grain, grpc, pyarrow, ...) are lazy.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import queue
import threading
import time
from collections.abc import Iterator, Sequence

from input_client import PipelineSpec

# Shared with scripts/ (re-exported: the tests import them from here or from there).
from input_server.testing.files import (  # noqa: F401
    FORMATS,
    example_bytes,
    jsonl_bytes,
    write_arrayrecord,
    write_bytes,
    write_format,
    write_parquet,
    zst_multiframe,
)
from input_server.testing.maxtext import TINY_MAXTEXT  # noqa: F401
from input_server.testing.memory_bound import (  # noqa: F401
    bounded_server,
    can_bound_memory,
    run_bounded,
)
from input_server.testing.processes import (  # noqa: F401
    ChildProcess,
    ServerProcess,
    cli_argv,
    find_python,
    free_port,
    health,
    serve_servicer,
    write_token_file,
)
from input_server.testing.reference import batch_bytes, run_pipeline  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def script(name: str) -> str:
    """The absolute path of scripts/NAME, so script tests pass from any working folder."""
    return str(SCRIPTS / name)


# --- Pipelines run in process, and comparing their batches --------------------------------------


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


def needs_memory_cgroup(why: str) -> None:
    """Skips the test where no memory cgroup can be made (it needs a writable /sys/fs/cgroup):
    what it does could take the host down, not just its server."""
    import pytest

    if not can_bound_memory():
        pytest.skip(f"no memory cgroup can be made here: {why}")


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


def serve_files(
    folder, *files: str, flags: Sequence[str] = (), name: str = "s", env=None
) -> tuple[ChildProcess, str]:
    """`input-server serve FLAGS` on the Unix socket `folder`/NAME.sock, allowed to read the
    folders that hold `files` (a `--data-root` each), its output in `folder`/NAME.log: the
    process (the caller kills it) and its target."""
    roots = dict.fromkeys(os.path.dirname(os.path.abspath(f)) for f in files)
    child, targets = serve_cli(
        "--listen",
        f"unix://{folder}/{name}.sock",
        *(arg for root in roots for arg in ("--data-root", root)),
        *flags,
        log=os.path.join(folder, f"{name}.log"),
        env=env,
    )
    return child, targets[0]


# --- Tokens: TCP and abstract listeners need one ------------------------------------------------

# The tokens of the servers tests started, by target: the helpers below send a target's token.
TOKENS: dict[str, str] = {}


def dial(target: str, token: str | None = None, options=()):
    """A raw gRPC channel to `target`, sending `token` (default the target's in `TOKENS`)."""
    import grpc

    from input_client.auth import TokenInterceptor

    channel = grpc.insecure_channel(target, options=list(options))
    token = TOKENS.get(target) if token is None else token
    return grpc.intercept_channel(channel, TokenInterceptor(token)) if token else channel


# --- Talking to servers, real and fake ------------------------------------------------------------


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


def other_stream_spec(docs: Sequence[str], folder) -> PipelineSpec:
    """The memory tests' other client's spec (the stream that must keep flowing beside an
    attack): 300 documents with a small sentencepiece model of their own, endless, 4 x 128,
    in process; its files written in `folder`."""
    from input_server.data.builtin_corpora import write_jsonl
    from input_server.data.tokenizers.trainers import train_sentencepiece

    folder = pathlib.Path(folder)
    return PipelineSpec(
        source={"paths": [write_jsonl(docs[:300], folder / "good.jsonl")]},
        tokenizer={"model": train_sentencepiece(docs[:300], folder / "good")},
        batch={"seq_len": 128, "size": 4},
        order={"epochs": 0},
        workers={"count": 0},
    )


def assert_still_flowing(flowing: list, seconds: float = 1.0) -> None:
    """The other client's stream (`flowing_stream`'s list) gets messages over `seconds`."""
    import time

    seen = len(flowing)
    time.sleep(seconds)
    assert len(flowing) > seen, "the other stream stopped"


def assert_peak_within(server, before: int, mib: int) -> int:
    """A bounded server's peak memory rose by less than `mib` MiB over `before` bytes; the
    peak."""
    peak = server.peak.bytes
    assert peak - before < mib << 20, (before >> 20, peak >> 20)
    return peak


@contextlib.contextmanager
def flowing_stream(target: str, spec, timeout: float = 60, started: int = 0) -> Iterator[list]:
    """Another client's raw stream of `spec` (a proto), read in a thread while the block runs:
    the list its messages' arrival times are appended to (it stops growing if the stream
    fails). With `started`, the block runs once that many messages came (at most 60 s: a
    first batch waits for the tokenizer to load, longer on a loaded host). Cancelled at its
    next message once the block ends."""
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
    deadline = time.monotonic() + 60
    while len(flowing) < started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield flowing
    finally:
        stop.set()
        thread.join(30)


# --- The same documents in every file format the server reads ------------------------------------


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


def python_or_skip(version: str, why: str) -> str:
    """`find_python(version)`; without it, a skip here and a failure in CI (which has it)."""
    import pytest

    found = find_python(version)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"Python {version} is not installed; CI needs it for {why}.")
        pytest.skip(f"Python {version} is not installed here ({why})")
    return found


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


# --- Tests in parallel (pytest-xdist): what the workers of one run share ------------------------


def run_dir(config) -> pathlib.Path:
    """The folder every pytest-xdist worker of this run shares (each worker's basetemp lies in
    it); in one process, the machine's temporary folder."""
    import tempfile

    if getattr(config, "workerinput", None) is None:
        return pathlib.Path(tempfile.gettempdir())
    return pathlib.Path(config.option.basetemp).parent


@contextlib.contextmanager
def file_lock(path: pathlib.Path, *, shared: bool = False) -> Iterator[None]:
    """`path` locked (flock) for the block: alone, or `shared` with other shared holders."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_share(folder: pathlib.Path, *, alone: bool) -> Iterator[None]:
    """The machine for one test: `alone` (no other worker's test runs meanwhile) or beside
    others. A test that waits to run alone holds the gate, so the tests that start after it
    wait too and it is not starved by a stream of shared holders."""
    with contextlib.ExitStack() as held:
        with file_lock(folder / "gate.lock"):
            held.enter_context(file_lock(folder / "machine.lock", shared=not alone))
        yield
