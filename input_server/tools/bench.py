"""Throughput benchmark: this project's pipeline against the tokenizer's limit and a MaxText-style
Grain reference, in one run on the same corpus and cores (ratios, since machines are noisy).

Counts real (non-padding) tokens per second. `input-server bench SPEC.toml` and
`scripts/bench.py --corpus FILE --model SPM` both land here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np

from input_client.spec import PipelineSpec, SpecError
from input_client.wire import shift_left
from input_server.batching.pipeline import Pipeline, Workers, default_threads
from input_server.data.sources import DocumentSource
from input_server.tools.bench_server import _consume, _rate, bench_server
from input_server.tools.bench_time import estimate_s, minutes
from input_server.tools.report import plural


def corpus_texts(spec: PipelineSpec) -> list[str]:
    """All documents of the spec's source, in file order."""
    source = DocumentSource.from_spec(spec.source)
    return source.read_many(range(len(source)))


def epoch_token_counts(spec: PipelineSpec, texts: list[str]) -> tuple[int, int]:
    """Tokens in one epoch of `texts`, and those the batches keep (a document trimmed to
    `seq_len` counts only what is kept), to size runs by the tokens they deliver."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spec.tokenizer.model)
    lengths = [
        len(x)
        for x in sp.encode(
            texts,
            add_bos=spec.tokenizer.add_bos,
            add_eos=spec.tokenizer.add_eos,
            num_threads=os.cpu_count() or 1,
        )
    ]
    if spec.batch.packing == "concat_then_split":
        return sum(lengths), sum(lengths)
    return sum(lengths), sum(min(n, spec.batch.seq_len) for n in lengths)


def bench_sentencepiece(texts: list[str], spec: PipelineSpec, *, min_seconds: float) -> dict:
    """The limit: sentencepiece's own batch encode over the corpus on all cores, in its
    fastest output form (numpy arrays; see scripts/bench_tokenize.py)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spec.tokenizer.model)
    threads = os.cpu_count() or 1
    tokens, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        ids = sp.encode(
            texts,
            add_bos=spec.tokenizer.add_bos,
            add_eos=spec.tokenizer.add_eos,
            num_threads=threads,
            return_type="numpy",
        )
        tokens += sum(map(len, ids))
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return {
                "tokens": tokens,
                "seconds": elapsed,
                "tokens_per_s": _rate(tokens, elapsed),
                "threads": threads,
                "cpu_ns_per_token": 1e9 * (time.process_time() - cpu) / tokens,
            }


class _TokenizeAndTrim:
    """MaxText's per-document map: tokenize one text and trim it to the sequence length."""

    def __init__(self, model: str, seq_len: int, add_bos: bool, add_eos: bool):
        self.model, self.seq_len, self.add_bos, self.add_eos = model, seq_len, add_bos, add_eos
        self._sp = None

    def __getstate__(self):
        return {**self.__dict__, "_sp": None}

    def __call__(self, text: str) -> dict[str, np.ndarray]:
        if self._sp is None:
            import sentencepiece as spm

            self._sp = spm.SentencePieceProcessor(model_file=self.model)
        ids = self._sp.encode(text, add_bos=self.add_bos, add_eos=self.add_eos)
        ids = np.asarray(ids[: self.seq_len], dtype=np.int32)
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
    ds = ds.map(
        _TokenizeAndTrim(
            spec.tokenizer.model, b.seq_len, spec.tokenizer.add_bos, spec.tokenizer.add_eos
        )
    )
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
        result = _consume(it, lambda b: b["inputs_segment_ids"])
        if processes:  # the work ran in worker processes this process's CPU time misses
            del result["cpu_ns_per_token"]
    finally:
        close = getattr(it, "close", None)
        if close:
            close()
    return {**result, "processes": processes}


def bench_pipeline(spec: PipelineSpec, workers: Workers) -> dict:
    with Pipeline(spec).stream(workers=workers) as stream:
        result = _consume((p.arrays for p in stream), lambda b: b["inputs_segmentation"])
    return {**result, "processes": workers.processes, "threads": workers.threads}


def compare_packing(spec: PipelineSpec, texts: list[str]) -> dict:
    """first_fit packing efficiency of ours and of the reference on the same document order
    (unshuffled, so both see the documents alike), over full batches only (the reference
    drops the last partial batch)."""
    spec = spec.replace(order={"shuffle": False})

    def efficiency(batches, seg_key) -> float:
        real = slots = 0
        for b in batches:
            seg = b[seg_key]
            real += int(np.count_nonzero(seg))
            slots += seg.size
        return real / slots if slots else 0.0

    with Pipeline(spec).stream(workers=Workers(0, default_threads(0), "bench")) as stream:
        ours = [p.arrays for p in stream]
    if ours and int(np.count_nonzero(ours[-1]["inputs_segmentation"].any(axis=1))) < len(
        ours[-1]["inputs"]
    ):
        ours = ours[:-1]  # the partial last batch, which the reference drops
    it = iter(reference_dataset(spec, texts, 0))
    try:
        ref = list(it)
    finally:
        close = getattr(it, "close", None)  # Grain before 0.2.14 (Python 3.10's) has none
        if close is not None:
            close()
    return {
        "ours": efficiency(ours, "inputs_segmentation"),
        "reference": efficiency(ref, "inputs_segment_ids"),
        "ours_batches": len(ours),
        "reference_batches": len(ref),
    }


def _best(samples: list[dict]) -> dict:
    """The fastest of interleaved rounds (the others were slowed by whatever else ran), with
    every round's rate kept for the record."""
    best = max(samples, key=lambda r: r["tokens_per_s"])
    return {**best, "rounds_tokens_per_s": [r["tokens_per_s"] for r in samples]}


def _round_ratios(samples: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Each round's ratios, from measurements taken back to back in that round."""
    rate = {k: [r["tokens_per_s"] for r in v] for k, v in samples.items()}
    return {
        "in_process_over_limit": [
            o / li for o, li in zip(rate["ours"], rate["limit"], strict=True)
        ],
        **{
            f"server_{t}_over_in_process": [
                s / o for s, o in zip(rate[t], rate["ours"], strict=True)
            ]
            for t in ("unix", "tcp")
        },
    }


def run(
    spec: PipelineSpec,
    *,
    min_tokens: int = 8_000_000,
    min_seconds: float = 2.0,
    rounds: int = 5,
    progress: bool = True,
) -> dict[str, Any]:
    """Runs every measurement on `spec`'s corpus and returns figures and ratios.

    The limit, this pipeline and the served pipeline are measured back to back in each of
    `rounds` rounds. A ratio is the median of the rounds' own ratios, so a burst of other
    load on a shared machine skews one round, not the result; each rate reported is its best
    round. The slow reference runs once per worker count, on a quarter of the tokens.

    Raises:
      SpecError: a mixture, pre-tokenized data or no model: this compares one text source
        with its tokenizer (scripts/bench_mixture.py measures the others).
    """
    if spec.is_mixture or spec.source.token_field or not spec.tokenizer.model:
        raise SpecError(
            "source",
            "a mixture" if spec.is_mixture else spec.source.to_dict(),
            "must be one text source with a `tokenizer.model` for `input-server bench`, which "
            "compares it with its tokenizer; scripts/bench_mixture.py measures mixtures and "
            "pre-tokenized data",
        )

    def say(msg: str) -> None:
        if progress:
            print(f"[bench] {msg}", flush=True)

    import sentencepiece as spm

    texts = corpus_texts(spec)
    sp = spm.SentencePieceProcessor(model_file=spec.tokenizer.model)
    epoch_tokens, kept = epoch_token_counts(spec, texts)
    epochs = max(1, -(-min_tokens // max(1, kept)))
    spec = spec.replace(order={"epochs": epochs})
    say(
        f"{len(texts)} documents, {epoch_tokens} tokens per epoch ({kept} kept), "
        f"{epochs} epochs per run"
    )

    cores = os.cpu_count() or 1
    quick = bench_sentencepiece(texts, spec, min_seconds=min(0.5, min_seconds))
    t = estimate_s(
        limit_tokens_per_s=quick["tokens_per_s"],
        kept=kept,
        epochs=epochs,
        rounds=rounds,
        min_seconds=min_seconds,
        cores=cores,
    )
    say(
        f"this takes about {minutes(t['total'])}: the MaxText-style reference "
        f"~{minutes(t['reference'])}, {plural(rounds, 'round')} of ~{minutes(t['round'])}, "
        f"the packing comparison ~{minutes(t['packing'])} (from sentencepiece's "
        f"{quick['tokens_per_s'] / 1e6:.1f} M tokens/s here; --min-tokens and --rounds change it)"
    )
    reference = {}
    ref_spec = spec.replace(order={"epochs": max(1, epochs // 4)})
    for processes in sorted({0, 1, cores}):
        reference[processes] = bench_reference(ref_spec, texts, processes)
        say(
            f"MaxText-style reference, {plural(processes, 'process', 'processes')}: "
            f"{reference[processes]['tokens_per_s'] / 1e6:.2f} M tokens/s"
        )

    samples: dict[str, list[dict]] = {"limit": [], "ours": [], "unix": [], "tcp": []}
    served_spec = spec.replace(workers={"count": 0})
    for r in range(rounds):
        samples["limit"].append(bench_sentencepiece(texts, spec, min_seconds=min_seconds))
        samples["ours"].append(bench_pipeline(spec, Workers(0, default_threads(0), "bench")))
        for t in ("unix", "tcp"):
            samples[t].append(bench_server(served_spec, t))
        say(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{k} {v[-1]['tokens_per_s'] / 1e6:.2f}" for k, v in samples.items())
            + " M tokens/s"
        )
    limit, ours = _best(samples["limit"]), _best(samples["ours"])
    served = {t: _best(samples[t]) for t in ("unix", "tcp")}

    packing = compare_packing(spec, texts)
    say(
        f"first_fit packing efficiency, same order: ours {packing['ours']:.4f}, "
        f"reference {packing['reference']:.4f}"
    )
    best_ref = max(reference.values(), key=lambda r: r["tokens_per_s"])
    per_round = _round_ratios(samples)
    return {
        "corpus": {
            "paths": list(spec.source.paths),
            "documents": len(texts),
            "tokens_per_epoch": epoch_tokens,
            "kept_tokens_per_epoch": kept,
            "epochs": epochs,
        },
        "spec": dataclasses.asdict(spec.batch),
        "vocab_size": sp.vocab_size(),
        "cores": cores,
        "rounds": rounds,
        "sentencepiece_limit": limit,
        "reference": {str(k): v for k, v in reference.items()},
        "pipeline_in_process": ours,
        "server": served,
        "ratios": {
            **{k: float(np.median(v)) for k, v in per_round.items()},
            "in_process_over_best_reference": ours["tokens_per_s"] / best_ref["tokens_per_s"],
            "best_reference_processes": best_ref["processes"],
            "packing_efficiency_same_order": packing["ours"],
            "reference_packing_efficiency_same_order": packing["reference"],
        },
        "packing_same_order": packing,
        "ratios_per_round": per_round,
    }


def format_table(result: dict[str, Any]) -> str:
    rows = [("sentencepiece batch encode (limit)", result["sentencepiece_limit"])]
    rows += [
        (f"MaxText-style reference, {plural(int(k), 'process', 'processes')}", v)
        for k, v in result["reference"].items()
    ]
    rows.append(("this pipeline, in process", result["pipeline_in_process"]))
    rows += [(f"through server + client, {k}", v) for k, v in result["server"].items()]
    lines = [f"{'what':<42} {'M tokens/s':>10} {'packing':>8}  CPU ns/token"]
    for name, r in rows:
        eff = r.get("packing_efficiency")
        if "server_cpu_ns_per_token" in r:
            cpu = (
                f"{r['server_cpu_ns_per_token']:.0f} server + "
                f"{r['client_cpu_ns_per_token']:.0f} client"
            )
        else:
            cpu = f"{r['cpu_ns_per_token']:.0f}" if "cpu_ns_per_token" in r else ""
        lines.append(
            f"{name:<42} {r['tokens_per_s'] / 1e6:>10.2f} "
            f"{'' if eff is None else f'{eff:.3f}':>8}  {cpu}"
        )
    ratios, per_round = result["ratios"], result.get("ratios_per_round", {})
    lines.append("")
    for k, v in ratios.items():
        line = f"{k:<42} {v:>10.3f}" if isinstance(v, float) else f"{k:<42} {v:>10}"
        if k in per_round:  # the median of these
            line += "   rounds: " + " ".join(f"{x:.2f}" for x in per_round[k])
        lines.append(line)
    for t, r in result["server"].items():
        lines.append(f"{'wire bytes per token, ' + t:<42} {r['wire_bytes_per_token']:>10.2f}")
    return "\n".join(lines)
