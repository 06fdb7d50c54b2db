"""Benchmark: a sentencepiece model's encoders called from T threads at once, each thread
encoding groups of documents back to back, as a stream's threads do: tokens/s and CPU a
token for sentencepiece (one group a call, one thread a call), kitoken sharing one encoder,
and kitoken with a copy a thread (what `fast.Kitoken` does); and sentencepiece's own batch
call on every core from one caller (the limit `bench` compares with). Each side and thread
count runs in a child process of its own, so none warms another's caches.

    python3 scripts/bench/bench_backend_threads.py MODEL CORPUS.jsonl [--threads 1,8,13]
        [--seconds 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time

from input_server.testing.results import emit_json

SIDES = ("limit", "reference", "kitoken_shared", "kitoken_copies")
GROUP_DOCS = 256


def _encoder(side: str, model: str):
    """The side's call on one group, as a function of the group, for the calling thread."""
    if side in ("limit", "reference"):
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=model)
        threads = os.cpu_count() if side == "limit" else 1
        return lambda group: sp.encode(group, num_threads=threads)
    import kitoken

    shared = kitoken.Kitoken.from_sentencepiece_file(model)
    if side == "kitoken_shared":
        return lambda group: shared.encode_all(group, False)
    local = threading.local()

    def own(group):
        tok = getattr(local, "tok", None)
        if tok is None:
            tok = local.tok = kitoken.Kitoken.from_sentencepiece_file(model)
        return tok.encode_all(group, False)

    return own


def child(side: str, model: str, corpus: str, threads: int, seconds: float) -> dict:
    with open(corpus) as f:
        texts = [json.loads(line)["text"] for line in f]
    size = GROUP_DOCS * (16 if side == "limit" else 1)  # the limit's call takes a batch of many
    groups = [texts[i : i + size] for i in range(0, len(texts), size)]
    encode = _encoder(side, model)
    encode(groups[0])
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def run(k: int) -> None:
        i = k
        while time.perf_counter() < stop:
            counts[k] += sum(map(len, encode(groups[i % len(groups)])))
            i += threads

    t0, c0 = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall, cpu, tokens = time.perf_counter() - t0, time.process_time() - c0, sum(counts)
    return {
        "side": side,
        "threads": threads,
        "m_tokens_per_s": round(tokens / wall / 1e6, 2),
        "cpu_ns_per_token": round(cpu / tokens * 1e9),
        "cores": round(cpu / wall, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("corpus", help="jsonl with a `text` field")
    p.add_argument("--threads", default="1,8,13")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--child", nargs=2, metavar=("SIDE", "THREADS"), help=argparse.SUPPRESS)
    p.add_argument("--out")
    args = p.parse_args()
    if args.child:
        side, threads = args.child
        print(json.dumps(child(side, args.model, args.corpus, int(threads), args.seconds)))
        return
    rows = []
    for side in SIDES:
        for threads in [1] if side == "limit" else [int(t) for t in args.threads.split(",")]:
            argv = [sys.executable, __file__, args.model, args.corpus, "--seconds"]
            argv += [str(args.seconds), "--child", side, str(threads)]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=120 + args.seconds)
            lines = out.stdout.strip().splitlines()
            rows.append(
                json.loads(lines[-1]) if lines else {"side": side, "error": out.stderr[-400:]}
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    emit_json(
        {
            "date": datetime.date.today().isoformat(),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "model": os.path.basename(args.model),
            "group_documents": GROUP_DOCS,
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
