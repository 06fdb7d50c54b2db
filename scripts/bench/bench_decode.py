"""What the client's decode of a batch costs, in CPU ns a token, side by side in one run; JSON.

    python scripts/bench/bench_decode.py [--size 16] [--seq-len 2048] [--mean-segment 65]
        [--rounds 7] [--served-seconds 8] [--client DIR ...] [--json OUT]

Two parts, rounds interleaving the cases so the host's drift falls on all alike:

- `expand`: the compact form to MaxText's six arrays (`wire.expand_packed`) on synthetic
  batches of short documents (segment lengths geometric with mean `--mean-segment` tokens,
  packed in order, a row closed when the next segment does not fit), against `expand_before`,
  the implementation before this script (main at fef4196, copied below), the same into a new
  buffer each batch (no `wire.Buffers`), and the whole checked decode (`decode_checked`: the
  hostile-server checks, then the expansion), as the client runs them. The last
  `--retain` batches stay alive, as a client's prefetch queue and loop hold them. CPU time of
  this thread (`time.thread_time`), per token of the batch.
- `served` (with `--served-seconds` > 0): a real `input-server serve` on a Unix socket
  (tiktoken ranks trained on the standard library's docstrings: short documents), and for each
  `--client` folder (default: this checkout's `client/`; e.g. a `git archive` of an older
  commit's `client/` for "before") a consumer process that imports the client from there and
  takes batches as fast as they come. Its CPU per real token, by thread (the fetch thread
  decodes; gRPC's threads receive), from /proc, and its minor page faults per million tokens
  (each costs far more under gVisor, as on the TPU host, than on a plain kernel).

Median and min over rounds; `ratio` is the case's median over the first case's.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_client_cost import sidecar  # a sibling script: its folder is on the path

from input_client._server_checks import Expected, decode_checked
from input_client.proto import pb
from input_client.wire import Buffers, compact_arrays, encode_tensors, expand_packed
from input_server.testing.results import emit_json


def expand_before(inputs, segment_lengths, segments_per_row):
    """`wire.expand_packed` as it was at fef4196 (six allocations, a masked pass for padding,
    three 2-D shifts): the "before" of this script's figures."""
    rows, seq_len = inputs.shape
    wire_ids = inputs
    inputs = inputs.astype(np.int32, copy=False)
    lengths = segment_lengths.astype(np.int64)
    per_row = segments_per_row.astype(np.int64)
    row_ends = np.cumsum(per_row)
    cum = np.concatenate(([0], np.cumsum(lengths)))
    used = cum[row_ends] - cum[row_ends - per_row]
    slots = per_row + 1
    run_len = np.empty(int(slots.sum()), np.int64)
    pad_slot = np.cumsum(slots) - 1
    is_pad = np.zeros(len(run_len), bool)
    is_pad[pad_slot] = True
    run_len[~is_pad] = lengths
    run_len[pad_slot] = seq_len - used
    first_slot = pad_slot - per_row
    run_id = (np.arange(len(run_len)) - np.repeat(first_slot, slots) + 1).astype(np.int32)
    run_id[pad_slot] = 0
    seg = np.repeat(run_id, run_len).reshape(rows, seq_len)
    run_start = (np.cumsum(run_len) - run_len).astype(np.int32)
    pos = np.repeat(run_start, run_len)
    np.subtract(np.arange(rows * seq_len, dtype=np.int32), pos, out=pos)
    pos = pos.reshape(rows, seq_len)
    if (used < seq_len).any():
        np.copyto(pos, 0, where=np.arange(seq_len) >= used[:, None])

    def shift_left(a, dtype=None):
        out = np.empty(a.shape, dtype or a.dtype)
        out[:, :-1] = a[:, 1:]
        out[:, -1] = 0
        return out

    return {
        "inputs": inputs,
        "inputs_segmentation": seg,
        "inputs_position": pos,
        "targets": shift_left(wire_ids, np.int32),
        "targets_segmentation": shift_left(seg),
        "targets_position": shift_left(pos),
    }


def synthetic_batch(rng, size: int, seq_len: int, mean: float) -> pb.Batch:
    """A compact batch message of short documents (uint16 ids, as a <= 64k vocabulary's)."""
    lengths, per_row = [], []
    for _ in range(size):
        room, k = seq_len, 0
        while True:
            n = min(int(rng.geometric(1 / mean)), seq_len)
            if n > room:
                break
            lengths.append(n)
            room, k = room - n, k + 1
        per_row.append(k)
    ids = rng.integers(0, 1 << 16, (size, seq_len), dtype=np.int32)
    arrays = compact_arrays(ids, np.array(lengths, np.int32), np.array(per_row, np.int32), 1 << 16)
    msg = pb.Batch(num_tokens=sum(lengths))
    encode_tensors(arrays, into=msg.tensors)
    return msg


def bench_expand(o: argparse.Namespace) -> dict:
    """The expansion alone, before and after, and the whole checked decode after."""
    rng = np.random.default_rng(0)
    msgs = [synthetic_batch(rng, o.size, o.seq_len, o.mean_segment) for _ in range(o.batches)]
    expected = Expected(size=o.size, seq_len=o.seq_len, state_bytes=1 << 14)

    def arrays(m):
        return {
            t.name: np.frombuffer(t.data, np.dtype(t.dtype)).reshape(t.shape) for t in m.tensors
        }

    compact = [arrays(m) for m in msgs]
    for c in compact[:4]:  # the same six arrays either way
        a, b = expand_before(**c), expand_packed(**c)
        assert all(np.array_equal(a[k], b[k]) and b[k].dtype == np.int32 for k in a)
    buffers = Buffers(keep=o.retain + 2)  # as the client keeps them for its prefetch + 1
    cases = {
        "expand_before": lambda i: expand_before(**compact[i]),
        "expand_after_new_buffer": lambda i: expand_packed(**compact[i]),
        "expand_after": lambda i: expand_packed(**compact[i], buffers=buffers),
        "decode_checked_after": lambda i: decode_checked(msgs[i], expected, buffers),
    }
    tokens = o.size * o.seq_len * len(msgs)
    ns: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(o.rounds):
        for name, f in cases.items():
            held: collections.deque = collections.deque(maxlen=o.retain)
            start = time.thread_time()
            for i in range(len(msgs)):
                held.append(f(i))
            ns[name].append(1e9 * (time.thread_time() - start) / tokens)
    return summarize(ns)


def summarize(ns: dict[str, list[float]]) -> dict:
    first = statistics.median(next(iter(ns.values())))
    return {
        name: {
            "ns_per_token_median": statistics.median(v),
            "ns_per_token_min": min(v),
            "ratio": statistics.median(v) / first,
        }
        for name, v in ns.items()
    }


# The consumer process: imports the client from argv[1], takes batches for argv[4] seconds after
# a warm-up, prints its CPU per real token by thread.
CONSUMER = r"""
import collections, json, os, resource, sys, threading, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from input_client import InputClient
from input_client.spec import PipelineSpec

TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")

def cpu():
    # ns by thread: schedstat, or where it is missing (gVisor) utime + stime in clock ticks.
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except OSError:
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(fields[11]) + int(fields[12])) * TICK_NS
            except OSError:
                pass
    return out

spec = PipelineSpec.from_dict(json.loads(sys.argv[3]))
with InputClient(sys.argv[2], connect_timeout_s=120) as c, c.batches(spec, prefetch=2) as it:
    for _ in range(20):
        next(it)
    before, t0, p0, tokens = cpu(), time.perf_counter(), time.process_time(), 0
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    while time.perf_counter() - t0 < float(sys.argv[4]):
        tokens += int(np.count_nonzero(next(it)["inputs_segmentation"]))
    after, wall, proc = cpu(), time.perf_counter() - t0, time.process_time() - p0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    names = {t.native_id: t.name for t in threading.enumerate()}
    by = collections.Counter()
    for tid, n in after.items():
        name = names.get(tid)
        if name is None:
            try:
                name = open(f"/proc/self/task/{tid}/comm").read().strip()
            except OSError:
                name = str(tid)
        by["fetch" if "fetch" in name else "loop" if name == "MainThread" else "grpc"] += (
            n - before.get(tid, 0))
print(json.dumps({"tokens_per_s": tokens / wall, "process": 1e9 * proc / tokens,
                  "minor_faults_per_mtoken": 1e6 * faults / tokens,
                  **{k: v / tokens for k, v in by.items()}}))
"""


def bench_served(o: argparse.Namespace, clients: list[str]) -> dict:
    """Each client folder's consumer against one sidecar, rounds interleaved."""
    from input_server.data import builtin_corpora
    from input_server.data.tokenizers.trainers import write_tiktoken_model

    with tempfile.TemporaryDirectory(prefix="bench-decode-") as d:
        docs = builtin_corpora.stdlib_docstrings()
        data = builtin_corpora.write_jsonl(docs, os.path.join(d, "data.jsonl"))
        model = write_tiktoken_model(docs[:3000], os.path.join(d, "bpe.tiktoken"), vocab_size=8000)
        spec = {
            "source": {"paths": [data]},
            "tokenizer": {"model": model, "kind": "tiktoken"},
            "order": {"epochs": 0},
            "batch": {"size": o.size, "seq_len": o.seq_len},
        }
        runs: dict[str, list[dict]] = collections.defaultdict(list)
        with sidecar(d, d) as target:
            for _ in range(o.served_rounds):
                for client in clients:
                    argv = [sys.executable, "-c", CONSUMER, client, target, json.dumps(spec)]
                    out = subprocess.run(
                        [*argv, str(o.served_seconds)], capture_output=True, text=True, check=True
                    )
                    runs[client].append(json.loads(out.stdout.strip().splitlines()[-1]))
    first = statistics.median(r["process"] for r in runs[clients[0]])
    return {
        client: {
            **{k: statistics.median(r[k] for r in rs) for k in rs[0]},
            "process_ratio": statistics.median(r["process"] for r in rs) / first,
            "rounds": rs,
        }
        for client, rs in runs.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--mean-segment", type=float, default=65.0, help="tokens, geometric")
    ap.add_argument("--batches", type=int, default=40, help="distinct batches a round")
    ap.add_argument("--retain", type=int, default=4, help="batches kept alive, as a client")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--served-seconds", type=float, default=0.0, help="0: no served part")
    ap.add_argument("--served-rounds", type=int, default=3)
    ap.add_argument("--client", action="append", help="client folder(s) to serve (served part)")
    ap.add_argument("--json", help="also write the JSON here")
    o = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    here = os.path.join(root, "client")
    result = {"args": vars(o), "host_cpus": os.cpu_count(), "expand": bench_expand(o)}
    if o.served_seconds > 0:
        result["served"] = bench_served(o, o.client or [here])
    emit_json(result, o.json)


if __name__ == "__main__":
    main()
