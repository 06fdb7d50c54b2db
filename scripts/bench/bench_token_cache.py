"""Benchmark: epochs read through the token cache (`serve --token-cache`) against epochs without.

    python scripts/bench/bench_token_cache.py [--repeat 8] [--rounds 2] [--out FILE.json]
    python scripts/bench/bench_token_cache.py --corpus FILE.jsonl --model M.model  # or --builtin
    python scripts/bench/bench_token_cache.py --spec SPEC.toml   # its source and tokenizer instead

A corpus and its sentencepiece model (default the standard library's docstrings with a unigram
model trained on them, `--builtin stdlib-docstrings`), repeated `--repeat` times so that an
epoch is long enough to time, tokenized by the reference (what the cache keeps; the default
model is NFKC, which no fast backend takes anyway). The pipeline runs in this process on 2
threads (`Pipeline.stream`, no transport). Per round, side by side: an epoch without a cache,
the first epoch with an empty cache (tokenizing and writing), the second epoch (reading back),
and the second epoch in 2 worker processes. Printed as JSON: tokens/s of each (best round),
the ratios (median of the rounds' own), and whether every batch equals the uncached epoch's.
With `--spec`, its source, tokenizer and batch (its tokenizer forced to the reference, which is
what the cache keeps: e.g. a Hugging Face tokenizer.json whose normalizer no backend takes).

Then what keying the cache on the files' contents costs (`data/token_cache_digest.py`), under
"digest": the first digest of the epoch's files and of a `--digest-mb` file (the corpus's bytes
over and over, just written, so from the page cache: the hash's rate, not a disk's), the same
files' digests found remembered (a stat a file and one query), the check that a file is
unchanged (one stat, before each put and as each stream opens), and a pipeline's opening
without a cache against with one whose digests are remembered.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from input_client import PipelineSpec
from input_server.batching.grain_adapter import ensure_absl_flags_parsed
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline
from input_server.data import token_cache_digest as digests
from input_server.data.token_cache import TokenCache
from input_server.testing import corpus
from input_server.testing.results import emit_json


def epoch(spec: PipelineSpec, cache: TokenCache | None, processes: int) -> tuple[float, list]:
    """(tokens/s, the batches' inputs) of one epoch."""
    pipeline = Pipeline(spec, token_cache=cache)
    tokens, inputs = 0, []
    start = time.perf_counter()
    with pipeline.stream(parallelism=Parallelism(processes, 2)) as stream:
        for produced in stream:
            tokens += produced.num_tokens
            inputs.append(produced.batch.inputs.copy())
    return tokens / (time.perf_counter() - start), inputs


def _repeated(jsonl: str, times: int, path: str) -> str:
    """`jsonl`'s lines `times` over, in `path` (the cache keys a document by its place)."""
    with open(jsonl, "rb") as f:
        text = f.read()
    if text and not text.endswith(b"\n"):
        text += b"\n"
    with open(path, "wb") as f:
        f.write(text * times)
    return path


def _settled(paths: list[str]) -> None:
    """Waits until every file's last change is past the racy window, so that no digest timed
    below includes `token_cache_digest`'s wait for it."""
    newest = max(os.stat(p).st_ctime_ns for p in paths)
    time.sleep(max(0.0, (newest + digests.RACY_NS - time.time_ns()) / 1e9 + 0.05))


def _timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def digest_cost(spec: PipelineSpec, folder: str, big_mb: int) -> dict:
    """What the content key costs (see the module's docstring), in seconds unless named."""
    files = list(dict.fromkeys(Pipeline(spec).source.files()))
    big = os.path.join(folder, "big.bin")
    with open(files[0], "rb") as f:
        chunk = f.read(64 << 20) or b"x"
    with open(big, "wb") as f:
        for _ in range(-(-(big_mb << 20) // len(chunk))):
            f.write(chunk)
    big_bytes = os.path.getsize(big)
    _settled([*files, big])
    cache = TokenCache(os.path.join(folder, "digests"), 1 << 30)
    size = sum(os.path.getsize(p) for p in files)
    big_s = _timed(lambda: digests.file_states(cache, [big]))
    first_s = _timed(lambda: digests.file_states(cache, files))
    again_s = _timed(lambda: digests.file_states(cache, [*files, big]))
    states = digests.file_states(cache, files)
    watch = digests.SourceFiles(states * (1000 // len(states) + 1))
    check_s = _timed(watch.unchanged) / len(watch.states)
    open_plain = min(_timed(lambda: Pipeline(spec)) for _ in range(3))
    open_cached = min(_timed(lambda: Pipeline(spec, token_cache=cache)) for _ in range(3))
    cache.close()
    os.remove(big)
    return {
        "files": len(files),
        "bytes": size,
        "first_s": first_s,
        "big_bytes": big_bytes,
        "big_first_s": big_s,
        "gb_per_s": big_bytes / big_s / 1e9,
        "remembered_s": again_s,
        "check_us_a_file": check_s * 1e6,
        "pipeline_open_s": {"no_cache": open_plain, "cache_remembered": open_cached},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus.add_corpus_arguments(parser)
    parser.add_argument("--repeat", type=int, default=8, help="copies of the corpus an epoch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--spec", help="a spec TOML to measure instead of a corpus and model")
    parser.add_argument(
        "--digest-mb", type=int, default=256, help="the file whose first digest is timed"
    )
    args = parser.parse_args()
    ensure_absl_flags_parsed()
    with tempfile.TemporaryDirectory() as d:
        if args.spec:
            spec = PipelineSpec.from_toml(args.spec)
            spec = spec.replace(order={"epochs": 1}, tokenizer={"backend": "reference"})
        else:
            if not (args.corpus or args.model or args.builtin):
                args.builtin = "stdlib-docstrings"
            jsonl, model = corpus.corpus_from_arguments(parser, args)
            path = _repeated(jsonl, args.repeat, os.path.join(d, "docs.jsonl"))
            spec = PipelineSpec(
                source={"paths": [path]},
                tokenizer={"model": model, "backend": "reference"},
                batch={"seq_len": 1024, "size": 16},
                order={"epochs": 1},
            )
        documents = len(Pipeline(spec).source)
        rates: dict[str, list[float]] = {}
        same = True
        for _ in range(args.rounds):
            folder = os.path.join(d, "cache")
            shutil.rmtree(folder, ignore_errors=True)
            cache = TokenCache(folder, 8 << 30)
            runs = {
                "no_cache": epoch(spec, None, 0),
                "first_epoch_cached": epoch(spec, cache, 0),
                "second_epoch_cached": epoch(spec, cache, 0),
                "second_epoch_cached_2_processes": epoch(spec, cache, 2),
            }
            want = runs["no_cache"][1]
            for name, (rate, got) in runs.items():
                rates.setdefault(name, []).append(rate)
                same &= len(got) == len(want) and all(map(np.array_equal, got, want))
            cache.close()
        ratio = {
            f"{k}_over_no_cache": statistics.median(
                a / b for a, b in zip(v, rates["no_cache"], strict=True)
            )
            for k, v in rates.items()
            if k != "no_cache"
        }
        emit_json(
            {
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "date": time.strftime("%Y-%m-%d"),
                "command": " ".join(sys.argv),
                "documents": documents,
                "tokens_per_s": {k: max(v) for k, v in rates.items()},
                "ratios": ratio,
                "same_batches": same,
                "digest": digest_cost(spec, d, args.digest_mb),
            },
            args.out,
        )


if __name__ == "__main__":
    main()
