"""Benchmark: how long a (re)started sidecar holds the training loop.

    python scripts/bench/bench_start.py [--model RANKS.tiktoken] [--rounds 3] [--workers auto]
        [--before TREE] [--out FILE.json]

Side by side in one run, each server a real `input-server serve` process on a Unix socket, with
Llama-3-sized tiktoken ranks (default: 128k merges learned from the standard library's sources
and docstrings, ~123k tokens, plus one token no two tokens make, as Meta's file holds, so the
tokenizer.json is derived; `--model` takes a real `tokenizer.model`), 16 x 2048, first_fit,
workers 0 processes x 1 thread (what "auto" picked on the TPU host; `--workers auto` or
`PxT`), and with `--before TREE` the same from another source tree, by turns:
- `serve_to_listening_s`: from starting `serve` to its "serving on" line;
- `first_batch_cold_s`: a fresh server's first batch, nothing kept (an empty --tokenizer-cache);
- `first_batch_warm_s`: a fresh server's first batch, the derived tokenizer.json and the gate's
  verdict kept by an earlier server (the cold server's stream stays open until its backend is
  chosen: one loading behind the stream keeps them as it goes);
- `first_batch_warm_grain_loaded_s`: the same, asked for GRAIN_WAIT_S after listening, when
  Grain has loaded (on a many-core host its import overlaps the rest; what is left is the
  stream's own set-up, the tokenizer's first of all);
- `next_stream_first_batch_s`: the same server's next stream;
- `kill_restart_to_next_batch_s`: a loop taking batches (prefetch 2) from a server that is
  SIGKILLed and started again at once on the same socket and cache: from the kill to the first
  batch the loop had to wait for (the prefetched ones go first), and the loop's stall (timed
  from the restarted server's "serving on", which the loop waits for);
- `kill_to_standby_next_batch_s`: the same with a loaded standby beside the server (`serve
  --standby`, this tree only) and no restart, the loop asking throughout, and its stall.
With `--workers auto`, the same two with the tune cache kept (`serve --tune-cache`), after a
stream that ran until its search settled (at most SETTLE_S): `first_batch_remembered_s` and
`kill_restart_remembered_loop_stall_s`, the choice it opened at in `remembered`.
First batches are timed from the request; `*_from_start_s` adds the time since `serve` started.
Printed as JSON: each figure's rounds and median.
"""

from __future__ import annotations

import argparse
import base64
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

from input_client import InputClient, PipelineSpec
from input_server.data import builtin_corpora
from input_server.data.tokenizers.trainers import write_tiktoken_model
from input_server.testing.processes import cli_argv
from input_server.testing.results import emit_json

VOCAB = 128_000
GRAIN_WAIT_S = 5.0
SETTLE_S = 90.0
UNREACHABLE = b"\x01\x02\x03"  # no two tokens make it: fastokens' own loader refuses the file


def llama3_sized_ranks(folder: pathlib.Path) -> str:
    """Ranks of Llama 3's size trained offline on real text, made once and kept in `folder`."""
    path = folder / "llama3-sized.tiktoken"
    if path.exists():
        return os.fspath(path)
    folder.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = builtin_corpora.stdlib_docstrings() + builtin_corpora.pydoc_topics()
    for p in sorted(root.rglob("*.py")):
        if "site-packages" not in p.parts:
            try:
                texts.append(p.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                pass
    tmp = write_tiktoken_model(texts, folder / "trained.tiktoken", vocab_size=VOCAB)
    lines = pathlib.Path(tmp).read_text(encoding="ascii").splitlines()
    lines.append(f"{base64.b64encode(UNREACHABLE).decode()} {len(lines)}")
    pathlib.Path(tmp).write_text("\n".join(lines) + "\n", encoding="ascii")
    os.replace(tmp, path)
    return os.fspath(path)


class Serve:
    """`input-server serve` on `sock`, its tokenizer cache in `keep`; `listening_s` after its
    start, `started` its perf_counter at start."""

    def __init__(
        self,
        sock: str,
        keep: str,
        roots: list[str],
        tree: str | None = None,
        tune_cache: str = "off",
        standby: bool = False,
    ):
        self.started = time.perf_counter()
        env = dict(os.environ)
        if tree:  # the server of another source tree (its client and server packages first;
            # the host's own PYTHONPATH kept after them: a TPU host finds its JAX there)
            paths = [tree, os.path.join(tree, "client"), env.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        args = ["--listen", f"unix://{sock}", "--tokenizer-cache", keep, "--tune-cache", tune_cache]
        for root in roots:
            args += ["--data-root", root]
        if standby:  # said once loaded, before it takes the socket over
            args.append("--standby")
        self.p = subprocess.Popen(
            cli_argv("serve", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            # `python -m` puts its folder first on sys.path, before PYTHONPATH: each tree's
            # server runs from its own root (this one's: the repository's).
            cwd=tree
            or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )
        line = self.p.stdout.readline()
        if ("standby:" if standby else "serving on") not in line:
            self.p.kill()
            said = self.p.stderr.read()[-2000:]
            raise RuntimeError(f"serve did not start: {line!r}; it said: {said}")
        # Its log is not read from here on: drained, so a full pipe never blocks it.
        threading.Thread(target=self.p.stderr.read, daemon=True).start()
        self.listening_s = time.perf_counter() - self.started
        self.target = f"unix://{sock}"

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(timeout=30)


def first_batch(target: str, spec: PipelineSpec, settle: bool = False) -> tuple[float, float]:
    """(seconds from the request to the first batch, perf_counter when it came). With
    `settle`, the stream stays open until its tokenizer backend is chosen (one loading behind
    the stream writes what the tokenizer cache keeps as it goes, as a server that serves on
    would), at most 120 s."""
    with InputClient(target) as client:
        start = time.perf_counter()
        with client.batches(spec) as it:
            next(it)
            now = time.perf_counter()
            deadline = now + 120
            while settle and time.perf_counter() < deadline:
                streams = client.info().streams
                if streams and not streams[0].tokenizer_backend_why.startswith("while "):
                    break
                time.sleep(0.05)
    return now - start, now


def settled(target: str, spec: PipelineSpec, tune: str) -> str | None:
    """Takes batches until the stream's "auto" search settles and its choice is in the tune
    cache at `tune` (a settled search may still be switching to its choice, which it keeps
    once there), at most SETTLE_S: the choice, as PxT; None if it was not kept in time."""

    def kept() -> bool:
        return os.path.isdir(tune) and any(not f.endswith(".tmp") for f in os.listdir(tune))

    with InputClient(target) as client, client.batches(spec) as it:
        deadline = time.perf_counter() + SETTLE_S
        while time.perf_counter() < deadline:
            next(it)
            (stream,) = client.info().streams
            if stream.tuning_state == "settled" and kept():
                return f"{stream.worker_processes}x{stream.worker_threads}"
    return None


def remembered(
    work: pathlib.Path, keep: str, roots: list[str], spec: PipelineSpec, tree: str | None
) -> dict:
    """A fresh server's first batch and a restart's stall with the tune cache kept by a
    server whose stream settled."""
    tune = os.fspath(work / "tune")
    shutil.rmtree(tune, ignore_errors=True)
    server = Serve(os.fspath(work / "t.sock"), keep, roots, tree, tune)
    try:
        choice = settled(server.target, spec, tune)
    finally:
        server.kill()
    if choice is None:  # nothing remembered: the figures would not be a remembered start's
        return {"remembered": "none kept within SETTLE_S"}
    server = Serve(os.fspath(work / "t.sock"), keep, roots, tree, tune)
    try:
        took = first_batch(server.target, spec)[0]
    finally:
        server.kill()
    restart = kill_and_restart(os.fspath(work / "t.sock"), keep, roots, spec, tree, tune)
    return {
        "remembered": choice,
        "first_batch_remembered_s": took,
        "kill_restart_remembered_loop_stall_s": restart["loop_stall_s"],
    }


def _killed_under(it, kill) -> dict:
    """A loop with a full prefetch (six batches taken, then a pause, as a loop slower than its
    input) whose server `kill()` ends (and starts another, or leaves it to a standby): from
    the kill to the first batch the loop had to wait for (the prefetched ones go first), and
    that wait, the loop's stall."""
    for _ in range(6):
        next(it)
    time.sleep(0.5)
    killed = time.perf_counter()
    kill()
    for _ in range(10_000):  # bounded: a server that never comes back ends the bench
        asked = time.perf_counter()
        next(it)
        waited = time.perf_counter() - asked
        if waited > 0.05:
            return {"to_next_batch_s": time.perf_counter() - killed, "loop_stall_s": waited}
    raise RuntimeError("the loop never waited after the kill: was the server killed?")


def kill_and_restart(
    sock: str,
    keep: str,
    roots: list[str],
    spec: PipelineSpec,
    tree: str | None,
    tune_cache: str = "off",
) -> dict:
    """A loop taking batches from a server SIGKILLed and started again at once (the loop asks
    again once the new one says "serving on")."""
    servers = [Serve(sock, keep, roots, tree, tune_cache)]

    def restart() -> None:
        servers[0].kill()
        servers[0] = Serve(sock, keep, roots, tree, tune_cache)

    try:
        with InputClient(servers[0].target) as client, client.batches(spec, prefetch=2) as it:
            return _killed_under(it, restart)
    finally:
        servers[0].kill()


def kill_to_standby(sock: str, keep: str, roots: list[str], spec: PipelineSpec) -> dict:
    """A loop taking batches from a server SIGKILLed beside a loaded standby (`serve
    --standby` on the same socket), which takes the socket over; the loop asks on throughout,
    as a training loop does."""
    server = Serve(sock, keep, roots)
    standby = Serve(sock, keep, roots, standby=True)
    try:
        with InputClient(server.target) as client, client.batches(spec, prefetch=2) as it:
            return _killed_under(it, server.kill)
    finally:
        server.kill()
        standby.kill()


def workers_of(text: str) -> dict:
    """`--workers`: "auto", or PROCESSES x THREADS ("0x1")."""
    if text == "auto":
        return {"count": "auto"}
    processes, threads = (int(n) for n in text.split("x"))
    return {"count": processes, "threads": threads}


def one_round(
    model: str,
    data: str,
    work: pathlib.Path,
    workers: str,
    tree: str | None = None,
    kind: str = "tiktoken",
) -> dict:
    roots = sorted({os.path.dirname(model), os.path.dirname(data)})
    spec = PipelineSpec(
        source={"paths": [data]},
        tokenizer={"model": model, "kind": kind},
        batch={"seq_len": 2048, "size": 16, "packing": "first_fit"},
        order={"epochs": 0},  # forever: the restarted loop always has a next batch
        workers=workers_of(workers),
    )
    keep = work / "keep"
    shutil.rmtree(keep, ignore_errors=True)
    out: dict = {}
    for label in ("cold", "warm", "warm_grain_loaded"):
        server = Serve(os.fspath(work / f"{label}.sock"), os.fspath(keep), roots, tree)
        try:
            if label == "warm_grain_loaded":
                time.sleep(GRAIN_WAIT_S)
                out[f"first_batch_{label}_s"] = first_batch(server.target, spec)[0]
                continue
            took, at = first_batch(server.target, spec, settle=label == "cold")
            out[f"first_batch_{label}_s"] = took
            out[f"first_batch_{label}_from_start_s"] = at - server.started
            out.setdefault("serve_to_listening_s", server.listening_s)
            if label == "warm":
                out["next_stream_first_batch_s"] = first_batch(server.target, spec)[0]
        finally:
            server.kill()
    restart = kill_and_restart(os.fspath(work / "r.sock"), os.fspath(keep), roots, spec, tree)
    out["kill_restart_to_next_batch_s"] = restart["to_next_batch_s"]
    out["kill_restart_loop_stall_s"] = restart["loop_stall_s"]
    if tree is None:  # `--standby`: this tree's
        taken = kill_to_standby(os.fspath(work / "t.sock"), os.fspath(keep), roots, spec)
        out["kill_to_standby_next_batch_s"] = taken["to_next_batch_s"]
        out["kill_to_standby_loop_stall_s"] = taken["loop_stall_s"]
    if workers == "auto":
        out.update(remembered(work, os.fspath(keep), roots, spec, tree))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="tiktoken ranks (default: Llama-3-sized, made once)")
    parser.add_argument("--kind", default="tiktoken", help="the model's tokenizer.kind")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="0x1", help='"auto" or PROCESSES x THREADS')
    parser.add_argument(
        "--before",
        metavar="TREE",
        help="also serve from this source tree (e.g. a `git worktree` of an earlier commit), "
        "by turns with this one, each round: the figures of both",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    model = args.model or llama3_sized_ranks(builtin_corpora.cache_dir() / "bench_start")
    with tempfile.TemporaryDirectory(prefix="bench-start-", dir="/tmp") as tmp:
        work = pathlib.Path(tmp)
        data = builtin_corpora.write_jsonl(
            builtin_corpora.stdlib_docstrings(2000), work / "docs.jsonl"
        )
        trees = {"before": args.before, "after": None} if args.before else {"this": None}
        rounds: dict[str, list[dict]] = {label: [] for label in trees}
        for i in range(args.rounds):
            order = list(trees.items())
            for label, tree in order[::-1] if i % 2 else order:  # each tree first in turn
                run = one_round(os.path.abspath(model), data, work, args.workers, tree, args.kind)
                rounds[label].append(run)
    medians = {
        label: {
            k: round(statistics.median(r[k] for r in runs), 3)
            for k in runs[0]
            if k != "remembered" and all(k in r for r in runs)
        }
        for label, runs in rounds.items()
    }
    result = {
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": sys.version},
        "model": os.path.basename(model),
        "batch": f"16 x 2048, first_fit, workers {args.workers}",
        "median": medians.get("this") or medians,
        "rounds": {
            k: [{f: v if isinstance(v, str) else round(v, 3) for f, v in r.items()} for r in runs]
            for k, runs in rounds.items()
        },
    }
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
