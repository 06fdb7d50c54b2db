"""Benchmark: a real JAX train step on this host's accelerator (or CPU), fed four ways.

    python scripts/bench/bench_step.py [--model FILE --kind KIND] [--corpus FILE.jsonl]
        [--sizes 256x4,768x8] [--batch 16] [--seq-len 2048] [--steps 40]
        [--feeds device,host,server,server_sharded,grain_1,grain_auto] [--out FILE.json]

The step is scripts/bench/step_model.py's decoder (bfloat16 matmuls, the loss over chunks of tokens,
Adam), its vocabulary the tokenizer's. Each model size runs every feed in turn, in one process,
the step compiled once:

- `device`: one batch placed on the device once and reused: the step's own limit;
- `host`: a fresh numpy batch each step (batches taken from the server beforehand), handed to
  the step as any loop hands a host batch;
- `server`: `input-server serve` as a sidecar (its own process, `JAX_PLATFORMS=cpu`, a Unix
  socket, workers "auto"), read through `InputClient.batches(prefetch=2)`;
- `server_sharded`: the same with `sharding=` (the client places each batch on the devices);
- `grain_N`: a MaxText-style Grain pipeline in the training process (per-document tokenize
  and trim, first-fit packing, batch, shift; `input_server.benchmark.kinds.
  reference_dataset`) with N worker processes; `grain_auto` takes the count MaxText's
  `grain_worker_count=-1` takes (`grain.experimental.pick_performance_config`, MaxText's
  default `grain_ram_budget_mb` of 1024).

Per feed: median and p90 milliseconds a step (next() to the step's outputs ready) and the
device-resident median over it (`x_device`, 1.0 = no cost), the share of the loop spent
waiting for data, the CPU cores used by the server's process tree and by the training
process's tree (its own threads and Grain's workers) over the timed steps (the server's also
over their second half: the feed settled, its start apart), and the feed's
first batch. Before the models: the server's start (socket answering, first batch of a fresh
server, of the next stream). After them: the server SIGKILLed mid-run and restarted at once,
the loop's longest wait for a batch. JSON on stdout (and `--out`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from step_model import init_state, make_train_step, param_count, parse_size

from input_client import InputClient, PipelineSpec
from input_server.data.builtin_corpora import ensure_demo_assets
from input_server.testing.processes import cli_argv
from input_server.testing.results import emit_json

STEP_KEYS = ("inputs", "inputs_segmentation", "inputs_position", "targets", "targets_segmentation")
# MaxText's Grain pipeline names the same arrays its own way.
GRAIN_KEYS = {
    "inputs": "inputs",
    "inputs_segmentation": "inputs_segment_ids",
    "inputs_position": "inputs_positions",
    "targets": "targets",
    "targets_segmentation": "targets_segment_ids",
}
MAXTEXT_GRAIN_RAM_BUDGET_MB = 1024  # MaxText's base.yml `grain_ram_budget_mb`
STALL_S = 0.1  # a wait this long after the kill is the restart's, not the pipeline's
AFTER_KILL_S = 20.0  # a restarted server streams again well within this
ALL_FEEDS = ("device", "host", "server", "server_sharded", "grain_1", "grain_auto")


def tree_cpu_s(pid: int, without: int | None = None) -> float:
    """CPU seconds (user + system, with reaped children's) of `pid` and its live descendants,
    leaving out `without`'s tree (the sidecar is this process's child, but not its work)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / tick
    tree, frontier = {pid}, [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree and c != without]
        tree.update(kids)
        frontier += kids
    return sum(cpu.get(p, 0.0) for p in tree)


class Sidecar:
    """`input-server serve` on a Unix socket in its own process group, off the accelerator."""

    def __init__(self, folder: str, roots: list[str], cache: str):
        self.socket = os.path.join(folder, "input.sock")
        self.address = f"unix://{self.socket}"
        self.roots, self.cache, self.log = roots, cache, os.path.join(folder, "serve.log")
        self.p: subprocess.Popen | None = None

    def start(self) -> float:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "XDG_CACHE_HOME": self.cache}
        env.pop("XLA_FLAGS", None)
        roots = [a for r in self.roots for a in ("--data-root", r)]
        with open(self.log, "ab") as log:
            started = time.perf_counter()
            self.p = subprocess.Popen(
                cli_argv("serve", "--listen", self.address, *roots),
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )  # fmt: skip
        return started

    def kill(self) -> None:
        if self.p is not None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=60)

    def tail(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-3000:]


def first_batch(client: InputClient, spec: PipelineSpec, since: float) -> tuple[float, list]:
    """(seconds from `since` to a new stream's first batch, the stream's first batches)."""
    it = client.batches(spec, prefetch=2)
    batches = [next(it)]
    took = time.perf_counter() - since
    return took, [batches, it]


def server_start(sidecar: Sidecar, spec: PipelineSpec, host_batches: int) -> tuple[dict, list]:
    """A fresh server: socket answering, first batch, the next stream's; `host_batches` of its
    batches (numpy) for the `host` feed."""
    started = sidecar.start()
    client = InputClient(sidecar.address, connect_timeout_s=300)
    client.wait_ready(300)
    listening = time.perf_counter() - started
    cold, (batches, it) = first_batch(client, spec, started)
    batches += [next(it) for _ in range(host_batches - 1)]
    it.close()
    warm, (_, it2) = first_batch(client, spec, time.perf_counter())
    it2.close()
    client.close()
    figures = {"listening_s": listening, "first_batch_cold_s": cold, "next_stream_first_s": warm}
    return figures, [{k: np.array(b[k]) for k in STEP_KEYS} for b in batches]


def grain_iterator(spec: PipelineSpec, texts: list[str], workers: str):
    """MaxText's Grain pipeline in this process; (batches in the step's names, Grain's
    iterator, worker processes)."""
    import grain

    from input_server.benchmark.kinds import reference_dataset

    if workers == "auto":  # what MaxText's grain_worker_count=-1 does
        config = grain.experimental.pick_performance_config(
            ds=reference_dataset(spec, texts, 0),
            ram_budget_mb=MAXTEXT_GRAIN_RAM_BUDGET_MB,
            max_workers=None,
            max_buffer_size=None,
        )
        processes = config.multiprocessing_options.num_workers
    else:
        processes = int(workers)
    it = iter(reference_dataset(spec, texts, processes))
    return ({k: b[g] for k, g in GRAIN_KEYS.items()} for b in it), it, processes


def _nothing() -> None:
    pass


class Feeds:
    """What each feed hands the loop, and whose CPU counts as its input pipeline."""

    def __init__(self, spec, texts, host_batches, sidecar: Sidecar):
        self.spec, self.texts, self.host, self.sidecar = spec, texts, host_batches, sidecar
        self.client = InputClient(sidecar.address, connect_timeout_s=300)

    def open(self, name: str):
        """(an iterator of batches, what closes it, the process whose tree is the input
        pipeline, detail)."""
        import itertools

        import jax

        if name == "device":
            placed = jax.device_put({k: self.host[0][k] for k in STEP_KEYS})
            return itertools.repeat(placed), _nothing, None, {}
        if name == "host":
            return itertools.cycle(self.host), _nothing, None, {}
        if name in ("server", "server_sharded"):
            sharding = None
            if name == "server_sharded":
                mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
                sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
            it = self.client.batches(self.spec, prefetch=2, sharding=sharding)
            return it, it.close, self.sidecar.p.pid, {}
        if name.startswith("grain_"):
            it, grain_it, n = grain_iterator(self.spec, self.texts, name.split("_", 1)[1])
            # Grain's iterator (not this project's): closed if its release can, so its worker
            # processes end before the next feed.
            return it, getattr(grain_it, "close", _nothing), None, {"grain_workers": n}
        raise SystemExit(f"unknown feed {name!r}; feeds: {', '.join(ALL_FEEDS)}")


def run_feed(step, state, feeds: Feeds, name: str, steps: int, warmup: int):
    """`warmup` untimed steps, then `steps` timed ones; (state, figures)."""
    import jax

    opened = time.perf_counter()
    it, close, input_pid, detail = feeds.open(name)
    batch = next(it)
    first = time.perf_counter() - opened
    for _ in range(warmup):
        state, loss = step(state, {k: batch[k] for k in STEP_KEYS})
        jax.block_until_ready(loss)
        batch = next(it)
    waits, steps_s = [], []
    server = feeds.sidecar.p.pid

    def cpu() -> tuple[float, float]:
        return tree_cpu_s(os.getpid(), server), tree_cpu_s(input_pid) if input_pid else 0.0

    cpu0 = cpu()
    wall0 = time.perf_counter()
    half = None  # (cpu, wall) at the timed steps' half: the second half is the settled feed
    for i in range(steps):
        if i == steps // 2:
            half = cpu(), time.perf_counter()
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        state, loss = step(state, {k: batch[k] for k in STEP_KEYS})
        jax.block_until_ready(loss)
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        steps_s.append(t2 - t0)
    wall = time.perf_counter() - wall0
    cpu1 = cpu()
    close()
    settled_wall = wall0 + wall - half[1]
    ordered = sorted(steps_s)
    return state, {
        "median_ms": 1e3 * statistics.median(steps_s),
        "p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))],
        "wait_share": sum(waits) / sum(steps_s),
        "median_wait_ms": 1e3 * statistics.median(waits),
        "trainer_tree_cores": (cpu1[0] - cpu0[0]) / wall,
        "server_tree_cores": (cpu1[1] - cpu0[1]) / wall if input_pid else None,
        "server_tree_cores_second_half": (
            (cpu1[1] - half[0][1]) / settled_wall if input_pid else None
        ),
        "first_batch_s": first,
        "last_loss": float(loss),
        **detail,
    }


def bench_size(size, feeds: Feeds, names, steps: int, warmup: int, chunk: int) -> dict:
    import jax

    step = make_train_step(size, chunk_tokens=chunk)
    state = init_state(size)
    params = param_count(state[0])
    compiled = time.perf_counter()
    state, loss = step(state, {k: feeds.host[0][k] for k in STEP_KEYS})
    jax.block_until_ready(loss)
    out = {"size": size.name, "params": params, "compile_s": time.perf_counter() - compiled}
    results = {}
    for name in names:
        print(f"[bench_step] {size.name} ({params / 1e6:.1f}M) {name} ...", file=sys.stderr)
        state, results[name] = run_feed(step, state, feeds, name, steps, warmup)
    if "device" in results:
        base = results["device"]["median_ms"]
        for r in results.values():
            r["x_device"] = base / r["median_ms"]
    return {**out, "feeds": results}


def restart_stall(step, state, feeds: Feeds, kill_at: int, most_steps: int) -> dict:
    """The server SIGKILLed after `kill_at` steps and started again at once (its kept files
    in place), the loop going on until a batch came after a wait of over STALL_S (and 3 steps
    more), or AFTER_KILL_S passed (a loop whose prefetched batches outlast the restart never
    waits), or `most_steps`: the loop's longest wait for a batch after the kill."""
    import jax

    it = feeds.client.batches(feeds.spec, prefetch=2)
    waits, ends, killed_at, stalled = [], [], 0.0, None
    for i in range(most_steps):
        if i == kill_at:
            feeds.sidecar.kill()
            killed_at = time.perf_counter()
            feeds.sidecar.start()
        t0 = time.perf_counter()
        batch = next(it)
        ends.append(time.perf_counter())
        waits.append(ends[-1] - t0)
        if i >= kill_at and stalled is None and waits[-1] > STALL_S:
            stalled = i
        if stalled is not None and i >= stalled + 3:
            break
        if i > kill_at and ends[-1] - killed_at > AFTER_KILL_S:
            break
        state, loss = step(state, {k: batch[k] for k in STEP_KEYS})
        jax.block_until_ready(loss)
    it.close()
    after = waits[kill_at:]
    worst = after.index(max(after))
    return {
        "stall_s": max(after),
        "steps_before_the_stall": worst,  # the batches the loop still had in hand
        "kill_to_next_batch_s": ends[kill_at + worst] - killed_at,
        "wait_before_kill_median_ms": 1e3 * statistics.median(waits[:kill_at]),
        "killed_at_step": kill_at,
    }


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="tokenizer model (default: the demo's sentencepiece model)")
    p.add_argument("--kind", default="sentencepiece", help="the model's tokenizer kind")
    p.add_argument("--corpus", help="a jsonl corpus with a `text` field (default: the demo's)")
    p.add_argument("--sizes", default="256x4", help="model sizes D x L, comma-separated")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=40, help="timed steps a feed")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps a feed")
    p.add_argument("--feeds", default=",".join(ALL_FEEDS))
    p.add_argument("--host-batches", type=int, default=8, help="distinct batches of `host`")
    p.add_argument("--loss-chunk", type=int, default=2048, help="tokens a loss chunk")
    p.add_argument(
        "--restart-steps", type=int, default=300, help="the most steps of the restart run; 0: none"
    )
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error(f"--steps {args.steps}: at least 2 timed steps (the second half is read apart)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags; this script parses its own
    import jax

    folder = tempfile.mkdtemp(prefix="bench-step-")
    corpus, model = ensure_demo_assets(os.path.join(folder, "demo"))
    corpus, model = args.corpus or corpus, args.model or model
    roots = sorted({os.path.dirname(os.path.abspath(p)) for p in (corpus, model)})
    spec = PipelineSpec(
        source={"paths": [os.path.abspath(corpus)]},
        tokenizer={"model": os.path.abspath(model), "kind": args.kind},
        batch={"seq_len": args.seq_len, "size": args.batch, "packing": "first_fit"},
        order={"epochs": 0},
    )
    sidecar = Sidecar(folder, roots, os.path.join(folder, "cache"))
    devices = jax.devices()  # the chip is this process's before any worker process starts
    # Grain's workers re-import this script: they must keep off the accelerator.
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        start, host_batches = server_start(sidecar, spec, args.host_batches)
        feeds = Feeds(spec, [], host_batches, sidecar)
        vocab = feeds.client.describe_tokenizer(spec).vocab_size
        names = [n.strip() for n in args.feeds.split(",") if n.strip()]
        if any(n.startswith("grain_") for n in names):
            with open(corpus) as f:
                feeds.texts = [json.loads(line)["text"] for line in f]
        models = []
        for s in args.sizes.split(","):
            try:
                models.append(
                    bench_size(parse_size(s, vocab), feeds, names, args.steps, args.warmup,
                               args.loss_chunk)
                )  # fmt: skip
            except Exception as e:  # e.g. the accelerator's memory: the other sizes still run
                models.append({"size": s, "error": f"{type(e).__name__}: {str(e)[:400]}"})
            print(json.dumps(models[-1]), file=sys.stderr)
            if args.out:  # what was measured so far survives a run cut short
                with open(args.out + ".partial", "w") as f:
                    json.dump({"server_start": start, "models": models}, f)
        restart = None
        if args.restart_steps:
            size = parse_size(args.sizes.split(",")[0], vocab)
            step, state = make_train_step(size, chunk_tokens=args.loss_chunk), init_state(size)
            restart = restart_stall(step, state, feeds, args.warmup + 5, args.restart_steps)
        feeds.client.close()
    except BaseException:
        print(sidecar.tail(), file=sys.stderr)
        raise
    finally:
        sidecar.kill()
    emit_json(
        {
            "date": datetime.date.today().isoformat(),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "devices": f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})",
            "jax": jax.__version__,
            "tokenizer": {"kind": args.kind, "model": os.path.basename(model), "vocab": vocab},
            "batch": {"size": args.batch, "seq_len": args.seq_len, "packing": "first_fit"},
            "steps": args.steps,
            "server_start": start,
            "models": models,
            "restart": restart,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
