"""Peer benchmark: our served rate on a unigram sentencepiece model against TensorFlow Text's
`FastSentencepieceTokenizer` in process, on the same texts and the same `.model` (issue 30).

    python scripts/bench/bench_unigram_peer.py --tf-python /tmp/tfvenv/bin/python [--rounds 3]
    python scripts/bench/bench_unigram_peer.py            # the peer reported as not measured

TensorFlow is not a dependency of the project: the peer runs in a child process of another
Python that has it (`python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install
tensorflow-text==2.18.1`); the child imports only tensorflow, tensorflow_text and numpy and
reads the texts and the model's path from files. The peer tokenizes as a TF input pipeline
does: `tf.data` batches of 256 texts mapped through `tokenize` with `num_parallel_calls =
AUTOTUNE` (both cores), timed after a first pass (its rate: real tokens a second; CPU a token:
the child's, all its threads).

The model: a unigram model trained here on the standard library's docstrings
(`train_sentencepiece`'s defaults: NFKC, whitespace collapsed, as the tests' fixture models;
`--vocab-size`), or `--model`. The peer (tensorflow-text 2.18.1) takes only such models:
it refuses byte-fallback pieces ("Invalid SentencePiece piece type <0x00>") and its process
dies (SIGSEGV) loading an identity-normalization model; either ends this script, saying so.
Corpora: short (the docstrings) and long (pydoc topics).
Served: `input-server serve` in its own process and the client over a Unix socket
(`bench_server`), concat_then_split and no BOS/EOS, so it delivers exactly the tokens the peer
makes; sentencepiece's own batch limit beside them. Per round the three run back to back; a
ratio is the median of the rounds' own, each rate its best round. Ids: the peer's for every
document against sentencepiece's (the reference), the probe set too; and our pipeline's rows
for one unshuffled epoch (in process: invariant 1 makes them the served bytes) against the
reference's ids run together. Who tokenizes for us is `benchmark.preflight.backend_report`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from input_client import PipelineSpec
from input_server.batching.grain_adapter import ensure_absl_flags_parsed
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline
from input_server.benchmark.kinds import bench_limit, epoch_token_counts
from input_server.benchmark.preflight import backend_report
from input_server.benchmark.served import bench_server
from input_server.data.builtin_corpora import pydoc_topics, stdlib_docstrings, write_jsonl
from input_server.data.tokenizers import backends
from input_server.data.tokenizers.trainers import train_sentencepiece
from input_server.testing.results import emit_json

GROUP = 256  # texts a tf.data batch, as a pipeline's groups hold about
# The UTF-8 bytes a peer call takes, at most (but for a text longer alone):
# FastSentencepieceTokenizer 2.18.1 keeps a call's token count in 16 bits: past 32,767 tokens
# it aborts ("Expected shape dimensions to be non-negative") or, past 65,535, drops tokens.
BUDGET = 30_000

# The peer, run by the TF python: argv = texts.json, model, seconds, ids.npz, out.json, group,
# budget.
CHILD = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
import tensorflow_text as tft

texts_path, model_path, seconds, ids_path, out_path, group, budget = sys.argv[1:8]
with open(texts_path, encoding="utf-8") as f:
    given = json.load(f)
texts, probes = given["texts"], given["probes"]
with open(model_path, "rb") as f:
    tok = tft.FastSentencepieceTokenizer(f.read())
# Groups of `group` texts, fewer where their UTF-8 bytes (a bound on their tokens, but for a
# dummy prefix each) would pass `budget`: a larger call's token count wraps at 2 ** 16.
groups, size = [[]], 0
for t in texts:
    n = len(t.encode("utf-8")) + 1
    if groups[-1] and (len(groups[-1]) >= int(group) or size + n > int(budget)):
        groups.append([])
        size = 0
    groups[-1].append(t)
    size += n
ds = (
    tf.data.Dataset.from_tensor_slices(tf.ragged.constant(groups, tf.string))
    .map(tok.tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    .prefetch(tf.data.AUTOTUNE)
)
ids, lengths = [], []
for r in ds:  # the first pass: the ids, and TF's start-up left out of the timing
    ids.append(r.flat_values.numpy())
    lengths.append(r.row_lengths().numpy())
np.savez(ids_path, ids=np.concatenate(ids).astype(np.int32), lengths=np.concatenate(lengths))
tokens, passes = 0, 0
start, cpu = time.perf_counter(), time.process_time()
while passes == 0 or time.perf_counter() - start < float(seconds):
    for r in ds:
        tokens += int(r.flat_values.shape[0])
    passes += 1
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
kernel_tokens, kernel_cpu = 0, time.process_time()
for g in groups:  # the kernel alone: one eager call a group, no tf.data
    kernel_tokens += int(tok.tokenize(tf.constant(g, tf.string)).flat_values.shape[0])
kernel_cpu = time.process_time() - kernel_cpu
probe_ids = []
for p in probes:
    try:
        probe_ids.append(tok.tokenize(tf.constant([p.encode("utf-8")])).flat_values.numpy().tolist())
    except Exception as e:  # a text it cannot take (lone surrogates)
        probe_ids.append(type(e).__name__)
with open(out_path, "w") as f:
    json.dump({
        "tokens": tokens, "passes": passes, "seconds": elapsed,
        "tokens_per_s": tokens / elapsed, "cpu_ns_per_token": 1e9 * cpu / max(tokens, 1),
        "tensorflow": tf.__version__, "tensorflow_text": getattr(tft, "__version__", "?"),
        "probe_ids": probe_ids, "calls": len(groups),
        "eager_calls_cpu_ns_per_token": 1e9 * kernel_cpu / max(kernel_tokens, 1),
    }, f)
"""


class PeerError(Exception):
    """The TF child failed: said on stderr, without a traceback of this script."""


def run_peer(tf_python: str, texts_path: str, model: str, seconds: float, d: str) -> dict:
    """One run of the peer in a child process: its figures, and each document's ids."""
    ids_path, out_path = os.path.join(d, "peer_ids.npz"), os.path.join(d, "peer.json")
    args = [
        tf_python,
        "-c",
        CHILD,
        texts_path,
        model,
        str(seconds),
        ids_path,
        out_path,
        str(GROUP),
        str(BUDGET),
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise PeerError(f"the peer failed (exit {done.returncode}): {done.stderr[-2000:]}")
    with open(out_path) as f:
        result = json.load(f)
    with np.load(ids_path) as z:
        ids, lengths = z["ids"], z["lengths"]
    ends = np.cumsum(lengths)
    result["documents"] = [ids[e - n : e] for e, n in zip(ends, lengths, strict=True)]
    return result


def first_difference(want: list, got: list) -> dict:
    """How many documents' ids differ, and the first such document's index."""
    bad = [
        i
        for i, (a, b) in enumerate(zip(want, got, strict=True))
        if len(a) != len(b) or not np.array_equal(a, b)
    ]
    return {
        "documents": len(want),
        "differing": len(bad),
        "first_differing": bad[0] if bad else None,
    }


def probe_check(sp, probe_ids: list) -> dict:
    """The peer against sentencepiece on `backends.PROBES`; both refusing a text is alike."""
    differing = []
    for i, (probe, got) in enumerate(zip(backends.PROBES, probe_ids, strict=True)):
        try:
            want = sp.encode(probe)
        except Exception:  # noqa: BLE001 - sentencepiece refuses lone surrogates
            want = None
        if (want is None) != isinstance(got, str) or (want is not None and want != got):
            differing.append(i)
    return {"probes": len(backends.PROBES), "differing": differing}


def served_spec(jsonl: str, model: str, epochs: int, *, shuffle: bool = True) -> PipelineSpec:
    """The served pipeline: every token of every document kept, no BOS/EOS (the peer's)."""
    return PipelineSpec(
        source={"paths": [jsonl]},
        tokenizer={"model": model, "add_bos": False, "add_eos": False},
        batch={"seq_len": 1024, "size": 16, "packing": "concat_then_split"},
        order={"epochs": epochs, "shuffle": shuffle},
        workers={"count": 0},
    )


def rows_check(jsonl: str, model: str, reference: list) -> dict:
    """Our pipeline's rows for one unshuffled epoch against the reference's ids run together
    (in process, two threads; the served stream's bytes by invariant 1)."""
    spec = served_spec(jsonl, model, 1, shuffle=False)
    got = []
    with Pipeline(spec).stream(parallelism=Parallelism(0, 2)) as stream:
        for produced in stream:
            arrays = produced.arrays
            got.append(arrays["inputs"][arrays["inputs_segmentation"] != 0])
    got = np.concatenate(got) if got else np.zeros(0, np.int32)
    want = np.concatenate([np.asarray(x, np.int32) for x in reference])
    return {"tokens": int(want.size), "equal": bool(np.array_equal(got, want))}


def make_corpora(args, d: str) -> tuple[str, dict[str, list[str]]]:
    """The model and each corpus's texts."""
    short = stdlib_docstrings(args.max_docs)
    corpora = {"short": short, "long": pydoc_topics()[: args.max_docs]}
    corpora = {k: v for k, v in corpora.items() if k in args.corpora.split(",")}
    model = args.model or train_sentencepiece(
        short, os.path.join(d, "unigram"), vocab_size=args.vocab_size
    )
    return model, corpora


def bench_corpus(args, name: str, texts: list[str], model: str, d: str) -> dict:
    """Every round's peer, served and limit runs on one corpus, the ids checks and ratios."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model)
    jsonl = write_jsonl(texts, os.path.join(d, f"{name}.jsonl"))
    texts_path = os.path.join(d, f"{name}.texts.json")
    with open(texts_path, "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "probes": list(backends.PROBES)}, f)
    reference = sp.encode(texts)
    spec = served_spec(jsonl, model, 1)
    per_epoch, _ = epoch_token_counts(spec, texts)
    spec = served_spec(jsonl, model, max(1, -(-args.min_tokens // max(1, per_epoch))))
    result = {
        "documents": len(texts),
        "tokens_per_epoch": per_epoch,
        "epochs_served": spec.order.epochs,
        "our_backend": backend_report(spec, texts),
        "ids": {"served_rows_vs_reference": rows_check(jsonl, model, reference)},
    }
    runs: dict[str, list[dict]] = {"peer": [], "served": [], "limit": []}
    for r in range(args.rounds):
        if args.tf_python:
            peer = run_peer(args.tf_python, texts_path, model, args.seconds, d)
            if r == 0:
                result["ids"]["peer_vs_reference"] = first_difference(reference, peer["documents"])
                result["ids"]["peer_probes_vs_reference"] = probe_check(sp, peer["probe_ids"])
            del peer["documents"], peer["probe_ids"]
            runs["peer"].append(peer)
        runs["served"].append(bench_server(spec, "unix"))
        runs["limit"].append(bench_limit(texts, spec, min_seconds=args.seconds))
        print(
            f"[peer] {name} round {r + 1}/{args.rounds}: "
            + ", ".join(f"{k} {v[-1]['tokens_per_s'] / 1e6:.2f}" for k, v in runs.items() if v)
            + " M tokens/s",
            file=sys.stderr,
            flush=True,
        )
    for k, v in runs.items():
        if v:
            best = max(v, key=lambda x: x["tokens_per_s"])
            result[k] = {**best, "rounds_tokens_per_s": [x["tokens_per_s"] for x in v]}
            # The cores it kept busy in its best round (a loaded host gives fewer than 2).
            cpu = best.get("cpu_ns_per_token") or (
                best["server_cpu_ns_per_token"] + best["client_cpu_ns_per_token"]
            )
            result[k]["cores_busy"] = best["tokens_per_s"] * cpu / 1e9
    if not args.tf_python:
        result["peer"] = NOT_MEASURED
        result["ids"]["peer_vs_reference"] = NOT_MEASURED
    result["ratios"] = ratios(runs)
    return result


NOT_MEASURED = "not measured: no --tf-python given (a Python with tensorflow-text)"


def ratios(runs: dict[str, list[dict]]) -> dict[str, float]:
    """The median of the rounds' own ratios (each round's runs were back to back)."""

    def over(a: str, b: str) -> float:
        return statistics.median(
            x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs[a], runs[b], strict=True)
        )

    out = {"served_over_limit": over("served", "limit")}
    if runs["peer"]:
        out["served_over_peer"] = over("served", "peer")
        out["peer_over_limit"] = over("peer", "limit")
    return out


def model_facts(model: str) -> dict:
    """What the model is: its type, vocabulary and the settings fast backends trip on."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(spm.SentencePieceProcessor(model_file=model).serialized_model_proto())
    t, n = proto.trainer_spec, proto.normalizer_spec
    return {
        "type": sentencepiece_model_pb2.TrainerSpec.ModelType.Name(t.model_type),
        "vocab_size": len(proto.pieces),
        "normalization": n.name,
        "remove_extra_whitespaces": n.remove_extra_whitespaces,
        "byte_fallback": t.byte_fallback,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tf-python", help="a Python with tensorflow-text (the peer's)")
    parser.add_argument("--model", help="a unigram sentencepiece .model (default: trained here)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-docs", type=int, help="at most this many documents a corpus")
    parser.add_argument("--corpora", default="short,long", help="short, long or both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="the peer's and the limit's")
    parser.add_argument("--min-tokens", type=int, default=4_000_000, help="a served run's")
    parser.add_argument("--out")
    args = parser.parse_args()
    ensure_absl_flags_parsed()
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as d:
        model, corpora = make_corpora(args, d)
        facts = model_facts(model)
        try:
            results = {n: bench_corpus(args, n, texts, model, d) for n, texts in corpora.items()}
        except PeerError as e:
            sys.exit(f"bench_unigram_peer: {e}\n(--tf-python {args.tf_python})")
    emit_json(
        {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv),
            "model": {
                "path": args.model or f"trained here on the docstrings, asked {args.vocab_size}",
                **facts,
            },
            "peer": "tf.data batches of 256 mapped through FastSentencepieceTokenizer.tokenize, "
            "AUTOTUNE parallel calls"
            if args.tf_python
            else NOT_MEASURED,
            "served": "input-server serve + client, Unix socket, concat_then_split 16 x 1024, "
            "no BOS/EOS",
            "limit": "sentencepiece's own batch call on all cores",
            "corpora": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
