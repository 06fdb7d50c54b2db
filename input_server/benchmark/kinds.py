"""What `input-server bench` compares the pipeline with, for each tokenizer kind: the kind's
limit (its own fastest batch call on all cores) and the MaxText-style Grain reference, which
tokenizes per document as MaxText's tokenizer class of the kind does; and for `--kinds` (a row
per kind on one corpus), a model of each kind and the table.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from input_client.spec import PipelineSpec, TokenizerSpec
from input_client.wire import shift_left
from input_server.benchmark.served import consume, rate_of
from input_server.benchmark.table import audited
from input_server.data.tokenizers import KINDS as TOKENIZERS
from input_server.data.tokenizers import load_tokenizer

KINDS = tuple(TOKENIZERS)

# What the reference runs per document for each kind, said in each result: for Hugging Face,
# also what it leaves out of MaxText's.
REFERENCE_ENCODE = {kind: cls.REFERENCE for kind, cls in TOKENIZERS.items()}
# Training text for the models `--kinds` makes: enough for a 1000s-piece vocabulary, bounded
# so a large corpus does not spend minutes training.
TRAIN_CHARS = 20_000_000


def time_call(call: Callable, texts: list[str], min_seconds: float) -> dict:
    """`call` over `texts` again and again for at least `min_seconds`."""
    tokens, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        tokens += sum(call(texts))
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return {
                "tokens": tokens,
                "seconds": elapsed,
                "tokens_per_s": rate_of(tokens, elapsed),
                "cpu_ns_per_token": 1e9 * (time.process_time() - cpu) / tokens,
            }


def limit_threads(cores: int) -> list[int]:
    """The thread counts the limit is tried at: powers of two below `cores`, and `cores`. A
    library's calls on every core are not always its fastest: on the 13-core TPU host (gVisor)
    tiktoken's calls over short documents on 13 threads each hand the GIL on per document."""
    return sorted({*(2**i for i in range(cores.bit_length()) if 2**i < cores), cores})


def limit_calls(tokenizer, cores: int) -> dict[str, tuple[int, Callable]]:
    """The kind's batch calls at each of `limit_threads(cores)`, by name: (threads, call). A
    name that does not say its thread count (sentencepiece's, Hugging Face's) says it below
    `cores`."""
    calls: dict[str, tuple[int, Callable]] = {}
    for threads in sorted(limit_threads(cores), reverse=True):
        for name, call in tokenizer.limit_calls(threads).items():
            calls[name if name not in calls else f"{name} on {threads} threads"] = (threads, call)
    return calls


def pick_limit_call(tokenizer, texts: list[str], cores: int, seconds: float) -> tuple[str, dict]:
    """The fastest of the kind's batch calls here, at each of `limit_threads(cores)`, by a
    short run of each; (its name, every call's short run)."""
    calls = limit_calls(tokenizer, cores)
    tried = {name: time_call(call, texts, seconds) for name, (_, call) in calls.items()}
    return max(tried, key=lambda n: tried[n]["tokens_per_s"]), tried


class DocumentEncoder:
    """One document's ids as MaxText 0.2.5's tokenizer class of the kind gives them (a list of
    ints, as its `encode` returns); see `REFERENCE_ENCODE`. Picklable (for Grain's worker
    processes): the model is opened lazily in each."""

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self._encode = None

    def __getstate__(self):
        return {**self.__dict__, "_encode": None}

    def __call__(self, text: str) -> list[int]:
        if self._encode is None:
            self._encode = self._open()
        return self._encode(text)

    def _open(self) -> Callable[[str], list[int]]:
        return load_tokenizer(self.spec).maxtext_encoder()


def epoch_token_counts(spec: PipelineSpec, texts: list[str]) -> tuple[int, int]:
    """Tokens in one epoch of `texts`, and those the batches keep (a document trimmed to
    `seq_len` counts only what is kept), to size runs by the tokens they deliver."""
    tokenizer = load_tokenizer(spec.tokenizer)
    call = next(iter(tokenizer.limit_calls(os.cpu_count() or 1).values()))
    lengths = call(texts)
    if spec.batch.packing == "concat_then_split":
        return sum(lengths), sum(lengths)
    return sum(lengths), sum(min(n, spec.batch.seq_len) for n in lengths)


def bench_limit(
    texts: list[str], spec: PipelineSpec, *, min_seconds: float, call: str | None = None
) -> dict:
    """The limit: the tokenizer kind's own batch call over the corpus, in its fastest output
    form (sentencepiece's: numpy arrays, see scripts/bench/bench_tokenize.py); `call` names one of
    `limit_calls` (default the first on all cores)."""
    calls = limit_calls(load_tokenizer(spec.tokenizer), os.cpu_count() or 1)
    call = call or next(iter(calls))
    threads, run = calls[call]
    return {**time_call(run, texts, min_seconds), "threads": threads, "call": call}


class _TokenizeAndTrim:
    """MaxText's per-document map: tokenize one text as MaxText's tokenizer class of the kind
    does, and trim it to the sequence length."""

    def __init__(self, tokenizer: TokenizerSpec, seq_len: int):
        self.encode, self.seq_len = DocumentEncoder(tokenizer), seq_len

    def __call__(self, text: str) -> dict[str, np.ndarray]:
        ids = np.asarray(self.encode(text)[: self.seq_len], dtype=np.int32)
        return {"inputs": ids, "targets": ids}


def _shift_data(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """MaxText's ShiftData, so the reference does the same per-batch work as ours."""
    return {
        **batch,
        **{
            k: shift_left(batch[k]) for k in ("targets", "targets_segment_ids", "targets_positions")
        },
    }


def reference_dataset(spec: PipelineSpec, texts_source: Any, processes: int):
    """A MaxText-style Grain pipeline: per-document tokenize-and-trim map, first-fit packing
    (`FirstFitPackIterDataset`, bins = batch size), batch, shift, multiprocess prefetch."""
    import grain

    b = spec.batch
    ds = grain.MapDataset.source(texts_source)
    if spec.order.shuffle:
        ds = ds.shuffle(seed=spec.order.seed)
    ds = ds.repeat(spec.order.epochs or None)
    ds = ds.map(_TokenizeAndTrim(spec.tokenizer, b.seq_len))
    ds = ds.to_iter_dataset()
    ds = grain.experimental.FirstFitPackIterDataset(
        ds,
        length_struct={"inputs": b.seq_len, "targets": b.seq_len},
        num_packing_bins=b.size,
        shuffle_bins=False,
    )
    ds = ds.batch(b.size, drop_remainder=True).map(_shift_data)
    if processes > 0:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=processes))
    return ds


def bench_reference(spec: PipelineSpec, texts: list[str], processes: int) -> dict:
    ds = reference_dataset(spec, texts, processes)
    it = iter(ds)
    try:
        result = consume(it, lambda b: b["inputs_segment_ids"])
        if processes:  # the work ran in worker processes this process's CPU time misses
            del result["cpu_ns_per_token"]
    finally:
        it.close()
    return {**result, "processes": processes}


def parse_kinds(value: str) -> tuple[str, ...]:
    """`--kinds`: "all" or a comma-separated list of kinds, in `KINDS` order."""
    asked = set(KINDS) if value.strip() == "all" else {k.strip() for k in value.split(",")}
    unknown = sorted(asked - set(KINDS) - {""})
    if unknown or not asked - {""}:
        raise ValueError(
            f"`--kinds` must be `all` or a comma-separated list of {', '.join(KINDS)}; got "
            f"{value!r}."
        )
    return tuple(k for k in KINDS if k in asked)


def base_vocab_size(spec: TokenizerSpec) -> int:
    """The spec's model's vocabulary, less the ids its kind adds beyond its file (tiktoken's
    256 special tokens): what a trainer's `vocab_size` makes."""
    tokenizer = load_tokenizer(spec)
    return tokenizer.info().vocab_size - tokenizer.ADDED_IDS


def make_models(
    spec: PipelineSpec, texts: list[str], kinds: tuple[str, ...], folder: str
) -> dict[str, str]:
    """A model of each kind for the corpus, in `folder`: the spec's own for its kind, the
    others trained on the corpus's first `TRAIN_CHARS` characters with the spec's model's
    vocabulary size."""
    from input_server.data.tokenizers.trainers import (
        train_hf_tokenizer,
        train_sentencepiece,
        write_tekken_model,
        write_tiktoken_model,
    )

    vocab, used, sample = base_vocab_size(spec.tokenizer), 0, []
    for t in texts:
        if used >= TRAIN_CHARS:
            break
        sample.append(t)
        used += len(t)
    make = {
        "sentencepiece": lambda: train_sentencepiece(
            sample, os.path.join(folder, "spm"), vocab_size=vocab
        ),
        "huggingface": lambda: train_hf_tokenizer(
            sample, os.path.join(folder, "hf"), vocab_size=vocab
        ),
        "tiktoken": lambda: write_tiktoken_model(
            sample, os.path.join(folder, "bpe.tiktoken"), vocab_size=vocab
        ),
        "tekken": lambda: write_tekken_model(
            sample, os.path.join(folder, "tekken.json"), vocab_size=vocab
        ),
    }
    return {k: spec.tokenizer.model if k == spec.tokenizer.kind else make[k]() for k in kinds}


def _measured(row: dict) -> float | None:
    return row.get("tokens_per_s")  # None: skipped or failed (the kind's result says why)


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def row_of(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    """The `--kinds` table's row from one kind's `throughput.run` result; a figure that row's run
    could not measure is None."""
    ran = [r for r in result["reference"].values() if _measured(r) is not None]
    best_ref = max(ran, key=_measured) if ran else {}
    ratios = result["ratios"]
    unix = _measured(result["server"]["unix"])
    return {
        "kind": kind,
        "vocab_size": result["vocab_size"],
        "limit_call": result["limit"].get("call"),
        "limit_tokens_per_s": _measured(result["limit"]),
        "in_process_tokens_per_s": _measured(result["pipeline_in_process"]),
        "server_unix_tokens_per_s": unix,
        "best_reference_tokens_per_s": _measured(best_ref),
        "best_reference_processes": best_ref.get("processes"),
        "in_process_over_limit": ratios.get("in_process_over_limit"),
        "server_unix_over_limit": ratios.get("server_unix_over_limit"),
        "in_process_over_best_reference": ratios.get("in_process_over_best_reference"),
        "server_unix_over_best_reference": _over(unix, _measured(best_ref)),
        "reference_encode": result["reference_encode"],
        "tokenizer_backend": result["tokenizer_backend"]["backend"],
        "tokenizer_backend_why": result["tokenizer_backend"]["why"],
        "documents_differing": result["tokenizer_backend"]["documents_differing"],
        "audited_while_served": audited(result["server"]["unix"])
        if result["server"]["unix"].get("backend_groups")
        else None,
    }


def _cell(value: float | None, width: int, form: str, suffix: str = "") -> str:
    """A table cell (form "M": a rate in millions); "-" where nothing was measured (the
    kind's result says why)."""
    if value is None:
        return f"{'-':>{width}}{' ' * len(suffix)}"
    if form == "M":
        value, form = value / 1e6, ".2f"
    return f"{value:>{width}{form}}{suffix}"


def format_kinds_table(result: dict[str, Any]) -> str:
    """A row per kind: M real tokens/s and ratios (medians of the rounds' own, but the
    reference's, which runs once)."""
    head = (
        f"{'kind':<14} {'vocab':>6} {'limit':>7} {'ours':>7} {'unix':>7} {'ref':>7} "
        f"{'ours/limit':>10} {'unix/limit':>10} {'ours/ref':>9} {'unix/ref':>9}"
    )
    lines = [head]
    for r in result["kinds"]:
        lines.append(
            f"{r['kind']:<14} {r['vocab_size']:>6} "
            + " ".join(
                _cell(r[key], *how)
                for key, *how in (
                    ("limit_tokens_per_s", 7, "M"),
                    ("in_process_tokens_per_s", 7, "M"),
                    ("server_unix_tokens_per_s", 7, "M"),
                    ("best_reference_tokens_per_s", 7, "M"),
                    ("in_process_over_limit", 10, ".2f"),
                    ("server_unix_over_limit", 10, ".2f"),
                    ("in_process_over_best_reference", 8, ".1f", "x"),
                    ("server_unix_over_best_reference", 8, ".1f", "x"),
                )
            )
        )
    lines.append("")
    lines.append("M real tokens/s; ref = the best MaxText-style reference; limits and references:")
    for r in result["kinds"]:
        lines.append(f"  {r['kind']}: limit {r['limit_call']}")
        lines.append(
            f"  {' ' * len(r['kind'])}  tokenized by {r['tokenizer_backend']} "
            f"({r['tokenizer_backend_why']}; {r['documents_differing']} documents differ)"
            + (f"; served, the reference audited {a}" if (a := r["audited_while_served"]) else "")
        )
        lines.append(
            f"  {' ' * len(r['kind'])}  reference ({r['best_reference_processes']} processes "
            f"best) {r['reference_encode']}"
        )
    return "\n".join(lines)
