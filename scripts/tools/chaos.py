"""Chaos run: SIGKILL the server and the trainer during one long stream; prints JSON.

  python scripts/tools/chaos.py [--kills 5] [--restarts 3] [--batches 400] [--transport unix|tcp]
                          [--workers 0[,1,...]] [--seed 0] [--json OUT]

The server runs as a subprocess (`input-server serve`) and is SIGKILLed with its worker
processes, then started again on the same address; the trainer's iterator reconnects by
itself. The trainer is a subprocess too (this script's `trainer` mode): it appends every
batch's bytes to a log and every few steps saves a checkpoint (the log's length and the
iterator's JSON state, written atomically); it is SIGKILLed and restarted from its checkpoint,
truncating the log back to it, as a model would be restored. Trainer incarnations cycle
through `--workers`, so a resume may also change the worker count. The kills come in random
order, each a random number of steps after the previous one took effect; once all happened and
`--batches` steps are reached, the trainer is stopped with SIGTERM (it checkpoints and exits)
and its log is compared, batch by batch and byte for byte, with an uninterrupted in-process
run of the same spec (`Pipeline(spec).stream()`, through `input_server.testing.reference`'s
`run_pipeline`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import queue
import random
import shutil
import signal
import sys
import tempfile
import threading
import time

from input_server.testing.processes import (
    ChildProcess,
    ServerProcess,
    free_port,
    write_token_file,
)
from input_server.testing.reference import batch_bytes, run_pipeline
from input_server.testing.results import emit_json

# The stream must never stall this long without a batch (the server restarts take ~1 s).
PROGRESS_TIMEOUT_S = 120.0


# --- the trainer (a subprocess the driver kills) -----------------------------------------------


def trainer(args: argparse.Namespace) -> int:
    """Consumes batches, logging each and checkpointing every `--checkpoint-every` steps.

    Runs until `--batches` steps (0 = until SIGTERM, which, like a preemption notice, makes it
    checkpoint and exit). Prints `batch STEP WAIT_S RECONNECTS` after each step.
    """
    from input_client import InputClient, PipelineSpec

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open(args.spec) as f:
        spec = PipelineSpec.from_dict(json.load(f))
    step, state, log_len = 0, None, 0
    if os.path.exists(args.ckpt):  # restore: the model (here, the log) goes back with the data
        with open(args.ckpt) as f:
            ckpt = json.load(f)
        step, state, log_len = ckpt["step"], ckpt["state"], ckpt["log_bytes"]
    with open(args.log, "r+b" if os.path.exists(args.log) else "wb") as log:
        log.truncate(log_len)
        log.seek(log_len)

        def checkpoint() -> None:
            log.flush()
            os.fsync(log.fileno())
            tmp = args.ckpt + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"step": step, "state": it.get_state(), "log_bytes": log.tell()}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, args.ckpt)  # atomic: a kill leaves the old or the new checkpoint

        client = InputClient(args.target, connect_timeout_s=60, token_file=args.token_file)
        with (
            client,
            client.batches(spec, state=state, reconnect_deadline_s=args.reconnect_deadline_s) as it,
        ):
            while not stop.is_set() and (args.batches == 0 or step < args.batches):
                t = time.perf_counter()
                batch = next(it)
                wait = time.perf_counter() - t
                log.write(batch_bytes(batch))
                step += 1
                if step % args.checkpoint_every == 0:
                    checkpoint()
                print(f"batch {step} {wait:.4f} {it.reconnects}", flush=True)
                time.sleep(args.step_ms / 1000)  # the train step
            checkpoint()
    print("done", flush=True)
    return 0


# --- the driver ---------------------------------------------------------------------------------


def compare(logged: bytes, ref: list[bytes]) -> dict:
    """Batch-by-batch comparison of the trainer's log with the reference."""
    size = len(ref[0]) if ref else 1
    got = [logged[i : i + size] for i in range(0, len(logged), size)]
    index = {}
    for i, b in enumerate(ref):
        index.setdefault(hashlib.sha256(b).digest(), i)
    positions = [index.get(hashlib.sha256(b).digest()) for b in got]
    counts = collections.Counter(p for p in positions if p is not None)
    return {
        "batches_lost": sum(1 for i in range(len(ref)) if counts[i] == 0),
        "batches_duplicated": sum(c - 1 for c in counts.values() if c > 1),
        "batches_unknown": positions.count(None),
        "identical_to_reference": logged == b"".join(ref),
    }


@dataclasses.dataclass
class Events:
    """The kills still to come and those done ([step, event, trainer incarnation]), and when
    the next is due: a random 1..`max_gap` steps after the last one took effect (a server kill
    takes effect when the trainer's stream broke and reconnected: gRPC lets a few MB arrive
    ahead of the caller, so a kill is felt only once that is used)."""

    rng: random.Random
    max_gap: int
    to_come: list[str]
    done: list[list] = dataclasses.field(default_factory=list)
    felt: bool = True  # the last event took effect
    next_at: int = 0
    lines_since: int = 0

    def __post_init__(self):
        self.next_at = self.rng.randint(1, self.max_gap)

    def check_felt(self, step: int, reconnected: bool) -> None:
        if not self.felt:  # a trainer kill is felt when the new trainer delivers
            self.felt = self.done[-1][1] == "trainer kill" or reconnected
            if self.felt:
                self.next_at = step + self.rng.randint(1, self.max_gap)

    def due(self, step: int) -> bool:
        return self.felt and step >= self.next_at

    def take(self, step: int, incarnation: int) -> str:
        event = self.to_come.pop(0)
        self.done.append([step, event, incarnation])
        self.felt, self.lines_since = False, 0
        return event


class Trainers:
    """The trainer processes, one incarnation after another (each with the next entry of
    `workers` as its spec's worker count), and what each last reported."""

    def __init__(self, work: str, spec, workers: list[int], argv: list[str], log: str):
        self.work, self.spec, self.workers, self.argv, self.log = work, spec, workers, argv, log
        self.incarnation = 0
        self.reconnects: collections.Counter = collections.Counter()  # by incarnation
        self.proc = self._start()

    def _start(self) -> ChildProcess:
        spec_path = os.path.join(self.work, "spec.json")
        with open(spec_path, "w") as f:
            count = self.workers[self.incarnation % len(self.workers)]
            json.dump(self.spec.replace(workers={"count": count}).to_dict(), f)
        argv = [sys.executable, os.path.abspath(__file__), "trainer", "--spec", spec_path]
        return ChildProcess([*argv, *self.argv], log=self.log, read_lines=True)

    def restart(self) -> None:
        self.proc.kill()
        self.incarnation += 1
        self.proc = self._start()


def drive(trainers: Trainers, server: ServerProcess, events: Events, batches: int) -> dict:
    """Reads the trainer's progress lines, firing each event when due, until it is done;
    the longest stall and start-up the loop saw, and the error that ended it (None: none)."""
    longest_stall = longest_startup = 0.0
    first_batch, stopping = True, False
    while True:
        try:
            line = trainers.proc.lines.get(timeout=PROGRESS_TIMEOUT_S)
        except queue.Empty:
            return _driven(
                longest_stall, longest_startup, f"no progress for {PROGRESS_TIMEOUT_S:g} s"
            )
        if line is None:
            code = trainers.proc.p.wait()
            return _driven(
                longest_stall, longest_startup, f"the trainer exited with {code} before finishing"
            )
        if line == "done":
            return _driven(longest_stall, longest_startup, None)
        if not line.startswith("batch ") or stopping:
            continue
        _, step, wait, n_reconnects = line.split()
        step, wait, n_reconnects = int(step), float(wait), int(n_reconnects)
        if first_batch:
            longest_startup, first_batch = max(longest_startup, wait), False
        else:
            longest_stall = max(longest_stall, wait)
        events.lines_since += 1
        if events.lines_since > 100_000:
            return _driven(longest_stall, longest_startup, f"{events.done[-1]} never took effect")
        events.check_felt(step, n_reconnects > trainers.reconnects[trainers.incarnation])
        trainers.reconnects[trainers.incarnation] = n_reconnects
        if not events.due(step):
            continue
        if not events.to_come:
            if step >= batches:
                trainers.proc.p.send_signal(signal.SIGTERM)  # checkpoint and stop
                stopping = True
            continue
        if events.take(step, trainers.incarnation) == "server kill":
            server.kill()
            time.sleep(events.rng.uniform(0.0, 0.5))  # down for a while, then rescheduled
            server.start()
        else:
            trainers.restart()
            first_batch = True


def _driven(longest_stall: float, longest_startup: float, error: str | None) -> dict:
    return {"stall": longest_stall, "startup": longest_startup, "error": error}


def run(
    *,
    kills: int,
    restarts: int,
    batches: int,
    transport: str,
    workers: list[int],
    seed: int,
    checkpoint_every: int,
    seq_len: int,
    batch_size: int,
    max_gap: int,
    reconnect_deadline_s: float,
) -> dict:
    """Streams at least `batches` batches through `kills` server kills and `restarts` trainer
    kills, in random order (`Events`), then compares what the trainer logged with the
    uninterrupted stream's batches."""
    from input_client import PipelineSpec
    from input_server.batching.grain_adapter import ensure_absl_flags_parsed
    from input_server.data.builtin_corpora import ensure_demo_assets

    ensure_absl_flags_parsed()
    start = time.monotonic()
    corpus, model = ensure_demo_assets()
    spec = PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": model},
        batch={"seq_len": seq_len, "size": batch_size},
        order={"epochs": 0, "seed": seed},
        workers={"count": workers[0]},
    )
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="chaos-")
    target = f"unix://{work}/input.sock" if transport == "unix" else f"127.0.0.1:{free_port()}"
    # TCP is open to every local user: the server and the trainer share a token.
    token_file = write_token_file(work)[0] if transport == "tcp" else None
    paths = {k: os.path.join(work, k) for k in ("ckpt", "log", "server.log", "trainer.log")}
    kinds = ["server kill"] * kills + ["trainer kill"] * restarts
    rng.shuffle(kinds)
    trainer_argv = ["--target", target, "--ckpt", paths["ckpt"], "--log", paths["log"]]
    trainer_argv += ["--batches", "0", "--checkpoint-every", str(checkpoint_every)]
    trainer_argv += ["--reconnect-deadline-s", str(reconnect_deadline_s)]
    trainer_argv += ["--token-file", token_file] if token_file else []
    # The demo's files are the only data this server may read.
    server = ServerProcess(
        target, paths["server.log"], token_file, data_root=os.path.dirname(os.path.abspath(corpus))
    )
    server.start()
    trainers = Trainers(work, spec, workers, trainer_argv, paths["trainer.log"])
    events = Events(rng, max_gap, kinds)
    driven: dict = {"error": "the driver raised"}
    try:
        driven = drive(trainers, server, events, batches)
    finally:
        if driven["error"] is not None:
            trainers.proc.kill()
        else:
            trainers.proc.p.wait(timeout=60)
        server.kill()
    return _result(spec, work, paths, events, trainers, driven, start, transport, workers)


def _result(spec, work, paths, events, trainers, driven, start, transport, workers) -> dict:
    """What the run delivered against the uninterrupted stream; `ok` when it was exactly
    once through every event."""
    with open(paths["ckpt"]) as f:
        delivered = json.load(f)["step"]
    with open(paths["log"], "rb") as f:
        logged = f.read()
    ref = [batch_bytes(p.arrays) for p in run_pipeline(spec, limit=delivered)]  # uninterrupted
    done = events.done
    result = {
        "transport": transport,
        "workers": workers,
        "batch_shape": [spec.batch.size, spec.batch.seq_len],
        "server_kills": sum(e[1] == "server kill" for e in done),
        "kills_survived": 0,
        "trainer_restarts": sum(e[1] == "trainer kill" for e in done),
        "events": done,
        "reconnects": sum(trainers.reconnects.values()),
        "batches_delivered": delivered,
        **compare(logged, ref),
        "longest_stall_s": round(driven.get("stall", 0.0), 3),
        "longest_trainer_startup_s": round(driven.get("startup", 0.0), 3),
        "wall_s": round(time.monotonic() - start, 1),
        "error": driven["error"],
    }
    result["ok"] = (
        driven["error"] is None
        and result["identical_to_reference"]
        and not events.to_come
        and result["batches_lost"] == 0
        and result["batches_duplicated"] == 0
    )
    # A kill is survived when the stream it broke went on and the run ended exactly once.
    result["kills_survived"] = result["server_kills"] if result["ok"] else 0
    if result["ok"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        result["work_dir"] = work  # logs and checkpoint, to see what happened
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    t = sub.add_parser("trainer", help="(internal) the trainer process the driver kills")
    t.add_argument("--target", required=True)
    t.add_argument("--token-file", help="the server's token, for TCP")
    t.add_argument("--spec", required=True)
    t.add_argument("--ckpt", required=True)
    t.add_argument("--log", required=True)
    t.add_argument("--batches", type=int, default=0, help="steps to run; 0 = until SIGTERM")
    t.add_argument("--checkpoint-every", type=int, default=5)
    t.add_argument("--reconnect-deadline-s", type=float, default=60.0)
    t.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="milliseconds each step takes after its batch (a train step)",
    )
    parser.add_argument("--kills", type=int, default=5, help="server SIGKILLs")
    parser.add_argument("--restarts", type=int, default=3, help="trainer SIGKILLs + restarts")
    parser.add_argument(
        "--batches", type=int, default=400, help="batches the run delivers at least"
    )
    parser.add_argument(
        "--max-gap",
        type=int,
        default=40,
        help="at most this many steps between one event taking effect and the next",
    )
    parser.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    parser.add_argument(
        "--workers",
        default="0",
        help="worker processes, comma-separated: trainer incarnations cycle "
        "through them (e.g. 0,1,2)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--reconnect-deadline-s", type=float, default=60.0)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if args.mode == "trainer":
        return trainer(args)
    result = run(
        kills=args.kills,
        restarts=args.restarts,
        batches=args.batches,
        transport=args.transport,
        workers=[int(w) for w in args.workers.split(",")],
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        max_gap=args.max_gap,
        reconnect_deadline_s=args.reconnect_deadline_s,
    )
    emit_json(result, args.json)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
