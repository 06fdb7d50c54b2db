"""The first calls after `serve` listens are answered, and health and GetInfo are answered while
Grain still loads behind the socket (`serving/warm.py`): a restarted sidecar's client is
already waiting and calls the moment the socket appears. Grain's import swaps
`builtins.__import__` process-wide for a moment (its Parquet module imports pyarrow inside
`etils.epy.lazy_imports()`); a call that ran a `from ... import` in that moment (gRPC runs one
for every call), beside a Grain import on another thread, got a `LazyModule` for a function,
died with `'LazyModule' object is not callable` in the server log, and its client had no status
(issue 50, finding 5). The moment is as long as a GIL switch inside that block lets it be; the
server here holds it open for two seconds (a `sitecustomize` on its path that sleeps in etils'
lazy `__import__`, a stand-in for a busy host), and writes when it enters and leaves it. One
client opens a stream as the socket appears (its first batch waits for Grain), another half a
second later, and a third asks for health and GetInfo over and over meanwhile."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import time

import grpc
import pytest

from input_client import InputClient, PipelineSpec
from input_server.data.tokenizers.trainers import train_hf_tokenizer
from input_server.testing.processes import ChildProcess, cli_argv, health
from input_server.version import __version__

# The most the third client asks for (it stops a few answers after the hold ends).
ANSWERS_S = 60.0

SLOW_LAZY_IMPORTS = """\
import functools, os, time
from etils.epy import lazy_imports_utils as _lazy
_real = _lazy._lazy_import
def _write(what):
    with open(os.environ["LAZY_MARKS"], "a") as f:
        f.write(f"{what} {time.time()}\\n")
@functools.wraps(_real)
def _slow(*args, **kwargs):
    _write("in")
    time.sleep(2.0)
    try:
        return _real(*args, **kwargs)
    finally:
        _write("out")
_lazy._lazy_import = _slow
"""


@pytest.fixture(scope="module")
def hf_folder(docs, data_dir) -> str:
    """A real byte-level BPE tokenizer folder trained on the corpus's documents."""
    return train_hf_tokenizer(docs, os.path.join(data_dir, "start-race-hf"), vocab_size=1000)


def _slow_lazy_imports(folder) -> dict[str, str]:
    """An environment whose processes stay two seconds in each lazy import of etils', and
    write when they enter and leave it to `folder`/marks."""
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SLOW_LAZY_IMPORTS)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "LAZY_MARKS": str(folder / "marks")}


def _answers(target: str, marks: pathlib.Path) -> list[tuple[float, float, str]]:
    """Health and GetInfo asked over and over from the moment the socket appears until the
    server has left its held lazy import (`marks` says "out") and a few answers more, at most
    ANSWERS_S: (asked, answered, what) for each answer, by the wall clock (the marks' clock)."""
    out, end = [], time.monotonic() + ANSWERS_S
    path = target.removeprefix("unix://")
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.005)
    after = 0
    with InputClient(target, connect_timeout_s=15) as client:
        while time.monotonic() < end and after < 5:
            asked = time.time()
            try:
                status = health(target)
            except grpc.RpcError:
                continue  # not listening yet
            out.append((asked, time.time(), f"health {status}"))
            asked = time.time()
            out.append((asked, time.time(), f"info {client.info().server_version}"))
            after += marks.exists() and "out" in marks.read_text()
            time.sleep(0.05)
    return out


def _first_batch(target: str, spec: PipelineSpec, after_s: float) -> int:
    """A stream opened `after_s` after the socket appears: its first batch's rows."""
    with InputClient(target, connect_timeout_s=15) as client:
        client.info()  # the socket is there
        time.sleep(after_s)
        with client.batches(spec) as it:
            return len(next(it)["inputs"])


def test_calls_from_the_moment_the_socket_appears_are_answered(short_tmp, corpus, hf_folder):
    # A Hugging Face model in a worker process: opening the stream checks the model's copies,
    # which imports a function from the tokenizers' registry.
    spec = PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": hf_folder, "kind": "huggingface"},
        batch={"seq_len": 128, "size": 4},
        workers={"count": 1},
    )
    env = _slow_lazy_imports(short_tmp)
    roots = {os.path.dirname(corpus), os.path.dirname(hf_folder)}
    sock, log = short_tmp / "s.sock", short_tmp / "s.log"
    argv = ["--listen", f"unix://{sock}", *(a for r in roots for a in ("--data-root", r))]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        # The clients first: they wait for the socket.
        answers = [pool.submit(_first_batch, f"unix://{sock}", spec, s) for s in (0.0, 0.5)]
        asking = pool.submit(_answers, f"unix://{sock}", short_tmp / "marks")
        time.sleep(0.05)
        child = ChildProcess(cli_argv("serve", *argv), log=str(log), env=env)
        try:
            rows = [_outcome(a) for a in answers]
            asked = asking.result(timeout=ANSWERS_S + 30)
        finally:
            child.kill()
    said = log.read_text()  # what the server said first: it names a call that died unanswered
    assert "LazyModule" not in said and "grpc/_server.py" not in said, said[-3000:]
    assert rows == [spec.batch.size] * 2, (rows, said[-3000:])
    # Grain's lazy import (its Parquet module's) was held in the server, first of any process
    # (a worker process writes its own after), and health and GetInfo were answered, right,
    # while it was.
    assert (short_tmp / "marks").exists(), f"etils' lazy import was never held: {said[-3000:]}"
    marks = (short_tmp / "marks").read_text().split()
    assert marks[0::2][:2] == ["in", "out"], marks
    held = (float(marks[1]), float(marks[3]))
    inside = [what for a, b, what in asked if held[0] < a and b < held[1]]
    assert "health 1" in inside and any(w.startswith("info ") for w in inside), (held, asked)
    assert all(w in ("health 1", f"info {__version__}") for _, _, w in asked), asked


def _outcome(answer: concurrent.futures.Future):
    """A client's rows, or what it raised (the server's log then says why)."""
    try:
        return answer.result(timeout=90)
    except Exception as e:  # noqa: BLE001 - compared, with the log, by the test
        return repr(e)
