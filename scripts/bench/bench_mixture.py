"""Mixtures and pre-tokenized data through a real server, side by side in one run; prints a
table and JSON.

  python scripts/bench/bench_mixture.py --builtin stdlib-docstrings [--components 40] [--json OUT]
  python scripts/bench/bench_mixture.py --corpus FILE.jsonl --model SPM.model

Through a real server over a Unix socket (ratios, since machines are noisy):

- a mixture of `components` sources against the same documents as one source: throughput,
  and what the server holds (RSS, threads, worker processes) at the end of each stream;
- the corpus pre-tokenized (its ids in Parquet, JSON lines and ArrayRecord `tf.train.Example`
  files) streamed against the tokenizer's own limit on its text, with the CPU each side takes
  per token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

import numpy as np

from input_client.spec import PipelineSpec
from input_server.batching.grain_adapter import ensure_absl_flags_parsed
from input_server.benchmark.served import bench_server
from input_server.benchmark.throughput import bench_sentencepiece, corpus_texts, epoch_token_counts
from input_server.testing import corpus


def _split(texts: list[str], parts: int, directory: str) -> list[str]:
    """The documents dealt round-robin into `parts` jsonl files."""
    paths = []
    for c in range(parts):
        path = os.path.join(directory, f"part-{c:03d}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for t in texts[c::parts]:
                f.write(json.dumps({"text": t}) + "\n")
        paths.append(path)
    return paths


def write_ids(texts: list[str], model: str, directory: str) -> dict[str, dict[str, Any]]:
    """The corpus tokenized (no specials: the spec adds them as for text) and written as ids in
    each format; returns each format's source table."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import sentencepiece as spm
    from array_record.python import array_record_module

    from input_server.data.tf_example import make_example

    ids = spm.SentencePieceProcessor(model_file=model).encode(texts, num_threads=os.cpu_count())
    parquet = os.path.join(directory, "ids.parquet")
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}), parquet)
    jsonl = os.path.join(directory, "ids.jsonl")
    with open(jsonl, "w") as f:
        for x in ids:
            f.write(json.dumps({"ids": x}) + "\n")
    records = os.path.join(directory, "ids.array_record")
    writer = array_record_module.ArrayRecordWriter(records, "group_size:1")
    for x in ids:
        writer.write(make_example(ids=x))
    writer.close()
    return {
        "parquet": {"paths": [parquet], "format": "parquet", "token_field": "ids"},
        "jsonl": {"paths": [jsonl], "token_field": "ids"},
        "arrayrecord": {
            "paths": [records],
            "format": "arrayrecord",
            "record_format": "tf_example",
            "token_field": "ids",
        },
    }


def _best(rounds: list[dict]) -> dict:
    best = max(rounds, key=lambda r: r["tokens_per_s"])
    return {**best, "rounds_tokens_per_s": [r["tokens_per_s"] for r in rounds]}


def _specs(base: PipelineSpec, model: str, texts: list[str], components: int, tmp: str) -> dict:
    """Each stream compared, by name; its files written in `tmp`."""
    parts = _split(texts, components, tmp)
    one = base.replace(source={"paths": parts})
    mixture = PipelineSpec.from_dict(
        {
            **base.to_dict(),
            "source": [
                # Weights as the parts' sizes: the same documents in the same proportions.
                {"paths": [p], "weight": len(texts[c::components]), "name": f"part-{c}"}
                for c, p in enumerate(parts)
            ],
        }
    )
    ids = write_ids(texts, model, tmp)
    # With worker processes too: what each process holds for a mixture is its index of
    # every component's files, not a reader set per component and worker.
    two = {"count": 2}
    specs = {
        "one_source": one,
        "mixture": mixture,
        "one_source_2_processes": one.replace(workers=two),
        "mixture_2_processes": mixture.replace(workers=two),
    }
    more = {"epochs": 4 * base.order.epochs}
    specs.update({f"ids_{k}": base.replace(source=v, order=more) for k, v in ids.items()})
    # JSON lines of ids hold one process's GIL while read (each record parsed in Python):
    # what worker processes make of them, and what "auto" chooses (its search inside).
    specs["ids_jsonl_2_processes"] = specs["ids_jsonl"].replace(workers=two)
    specs["ids_jsonl_auto"] = specs["ids_jsonl"].replace(workers={"count": "auto"})
    return specs


def _ratios(rate: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each round's ratios: mixture over one source, and each id stream over the limit."""
    return {
        "mixture_over_one_source": [
            m / o for m, o in zip(rate["mixture"], rate["one_source"], strict=True)
        ],
        "mixture_over_one_source_2_processes": [
            m / o
            for m, o in zip(
                rate["mixture_2_processes"], rate["one_source_2_processes"], strict=True
            )
        ],
        **{
            f"{k}_over_tokenizer_limit": [
                i / li for i, li in zip(rate[k], rate["limit"], strict=True)
            ]
            for k in rate
            if k.startswith("ids_")
        },
    }


def run(
    corpus: str,
    model: str,
    *,
    components: int = 40,
    rounds: int = 3,
    seq_len: int = 2048,
    batch_size: int = 32,
    min_tokens: int = 8_000_000,
    say=print,
) -> dict:
    """Both comparisons; every figure is the best of `rounds` interleaved rounds, each
    round's kept too. Text streams run whole epochs to at least `min_tokens` tokens, id
    streams (several times as fast) to four times that."""
    base = PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": model},
        batch={"seq_len": seq_len, "size": batch_size},
        order={"epochs": 1},
        workers={"count": 0},
    )
    texts = corpus_texts(base)
    _, kept = epoch_token_counts(base, texts)
    epochs = max(1, -(-min_tokens // kept))
    base = base.replace(order={"epochs": epochs})
    with tempfile.TemporaryDirectory(prefix="bench-mixture-") as tmp:
        specs = _specs(base, model, texts, components, tmp)
        samples: dict[str, list[dict]] = {k: [] for k in (*specs, "limit")}
        for r in range(rounds):
            say(f"round {r + 1} of {rounds}")
            samples["limit"].append(bench_sentencepiece(texts, base, min_seconds=3.0))
            for name, spec in specs.items():
                samples[name].append(bench_server(spec, "unix"))
    ratio = _ratios({k: [x["tokens_per_s"] for x in v] for k, v in samples.items()})
    return {
        "corpus": corpus,
        "documents": len(texts),
        "components": components,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "epochs_text": epochs,
        "epochs_ids": 4 * epochs,
        "cpus": os.cpu_count(),
        "results": {k: _best(v) for k, v in samples.items()},
        "round_ratios": ratio,
        "median_ratios": {k: float(np.median(v)) for k, v in ratio.items()},
    }


def format_table(result: dict) -> str:
    lines = [f"{'stream':<24} {'tokens/s':>12} {'server ns/tok':>14} {'client ns/tok':>14} "
             f"{'server RSS MB':>14} {'threads':>8}"]  # fmt: skip
    for name, r in result["results"].items():
        lines.append(
            f"{name:<24} {r['tokens_per_s']:>12,.0f} "
            f"{r.get('server_cpu_ns_per_token', r.get('cpu_ns_per_token', 0)):>14.0f} "
            f"{r.get('client_cpu_ns_per_token', 0):>14.0f} "
            f"{r.get('server_rss_mb', 0):>14.0f} {r.get('server_threads', r.get('threads', 0)):>8}"
        )
    for k, v in result["median_ratios"].items():
        lines.append(f"{k}: {v:.2f} (median of rounds)")
    return "\n".join(lines)


def main() -> int:
    ensure_absl_flags_parsed()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    parser.add_argument("--components", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--min-tokens", type=int, default=8_000_000, help="text streams' tokens (ids: 4x)"
    )
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    jsonl, model = corpus.corpus_from_arguments(parser, args)
    result = run(
        jsonl,
        model,
        components=args.components,
        rounds=args.rounds,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        min_tokens=args.min_tokens,
        say=lambda m: print(m, file=sys.stderr),
    )
    print(format_table(result))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
