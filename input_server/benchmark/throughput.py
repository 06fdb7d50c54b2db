"""What one benchmark run measures, and in what order: this project's pipeline against the
tokenizer's limit and a MaxText-style Grain reference, in one run on the same corpus and cores
(ratios, since machines are noisy).

Counts real (non-padding) tokens per second, for any tokenizer kind (its limit and the
reference's per-document encode: kinds.py); `run_kinds` gives a row per kind. The package's
entry point (`input_server.benchmark.bench`, behind `input-server bench`) calls these.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from input_client.spec import PipelineSpec
from input_server.batching.parallelism import Parallelism, default_threads
from input_server.batching.pipeline import Pipeline
from input_server.benchmark.estimate import PIPELINE_SHARE, SERVER_START_S, estimate_s, minutes
from input_server.benchmark.kinds import (
    KINDS,
    REFERENCE_ENCODE,
    bench_limit,
    bench_reference,
    epoch_token_counts,
    make_models,
    pick_limit_call,
    reference_dataset,
    row_of,
)
from input_server.benchmark.preflight import backend_report, check_benchable
from input_server.benchmark.rounds import (
    Rounds,
    has_figures,
    medians,
    run_rounds,
    unavailable,
)
from input_server.benchmark.served import bench_server, consume
from input_server.data.sources import DocumentSource
from input_server.data.tokenizers import load_tokenizer
from input_server.plurals import plural


def corpus_texts(spec: PipelineSpec) -> list[str]:
    """All documents of the spec's source, in file order."""
    source = DocumentSource.from_spec(spec.source)
    return source.read_many(range(len(source)))


bench_sentencepiece = bench_limit  # the name bench_mixture.py (sentencepiece specs) calls


def bench_pipeline(spec: PipelineSpec, parallelism: Parallelism) -> dict:
    with Pipeline(spec).stream(parallelism=parallelism) as stream:
        result = consume((p.arrays for p in stream), lambda b: b["inputs_segmentation"])
    return {**result, **parallelism.to_dict()}


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

    with Pipeline(spec).stream(parallelism=Parallelism(0, default_threads(0))) as stream:
        ours = [p.arrays for p in stream]
    if ours and int(np.count_nonzero(ours[-1]["inputs_segmentation"].any(axis=1))) < len(
        ours[-1]["inputs"]
    ):
        ours = ours[:-1]  # the partial last batch, which the reference drops
    it = iter(reference_dataset(spec, texts, 0))
    try:
        ref = list(it)
    finally:
        it.close()
    return {
        "ours": efficiency(ours, "inputs_segmentation"),
        "reference": efficiency(ref, "inputs_segment_ids"),
        "ours_batches": len(ours),
        "reference_batches": len(ref),
    }


@dataclasses.dataclass(frozen=True)
class _Options:
    """How `run` measures (its arguments of the same names) and whether it reports progress."""

    rounds: int
    min_seconds: float
    transports: tuple[str, ...]
    packing: bool
    progress: bool

    def say(self, msg: str) -> None:
        if self.progress:
            print(f"[bench] {msg}", flush=True)


def _planned(
    spec: PipelineSpec, texts: list[str], min_tokens: int, say
) -> tuple[PipelineSpec, dict]:
    """`spec` with enough epochs for `min_tokens` kept tokens a run, and the corpus figures."""
    epoch_tokens, kept = epoch_token_counts(spec, texts)
    epochs = max(1, -(-min_tokens // max(1, kept)))
    say(
        f"{len(texts)} documents, {epoch_tokens} {spec.tokenizer.kind} tokens per epoch "
        f"({kept} kept), {epochs} epochs per run"
    )
    corpus = {
        "paths": list(spec.source.paths),
        "documents": len(texts),
        "tokens_per_epoch": epoch_tokens,
        "kept_tokens_per_epoch": kept,
        "epochs": epochs,
    }
    return spec.replace(order={"epochs": epochs}), corpus


def _pick_limit(spec: PipelineSpec, texts: list[str], cores: int, min_seconds: float, say):
    """The fastest of the kind's batch calls (a short run of each) and every one's figures."""
    call, tried = pick_limit_call(
        load_tokenizer(spec.tokenizer), texts, cores, min(0.5, min_seconds)
    )
    if len(tried) > 1:
        say(
            "limit: "
            + ", ".join(f"{n} {r['tokens_per_s'] / 1e6:.2f}" for n, r in tried.items())
            + f" M tokens/s: {call}"
        )
    return call, tried


def _say_estimate(
    o: _Options, kind: str, rate: float, corpus: dict, cores: int, processes_tried: list[int]
) -> None:
    """Tells how long the whole run will take, from the limit's rate measured here."""
    kept, epochs = corpus["kept_tokens_per_epoch"], corpus["epochs"]
    t = estimate_s(
        limit_tokens_per_s=rate,
        kept=kept,
        epochs=epochs,
        rounds=o.rounds,
        min_seconds=o.min_seconds,
        cores=cores,
    )
    # (estimate_s counts two served runs a round and the packing comparison.)
    t["round"] -= (2 - len(o.transports)) * (
        SERVER_START_S + kept * epochs / (PIPELINE_SHARE * max(rate, 1.0))
    )
    t["reference"] *= len(processes_tried) / len({0, 1, cores})
    t["packing"] = t["packing"] if o.packing else 0.0
    t["total"] = t["reference"] + o.rounds * t["round"] + t["packing"]
    o.say(
        f"this takes about {minutes(t['total'])}: the MaxText-style reference "
        f"~{minutes(t['reference'])}, {plural(o.rounds, 'round')} of ~{minutes(t['round'])}"
        + (f", the packing comparison ~{minutes(t['packing'])}" if o.packing else "")
        + f" (from the {kind} limit's {rate / 1e6:.1f} M tokens/s here and shares of it "
        "measured with sentencepiece; --min-tokens and --rounds change it)"
    )


def _bench_references(
    spec: PipelineSpec, texts: list[str], epochs: int, tried: list[int], o: _Options
) -> dict[int, dict]:
    """The slow reference once per worker count, on a quarter of the tokens; one that fails is
    kept with its error."""
    once = Rounds(samples={})
    ref_spec = spec.replace(order={"epochs": max(1, epochs // 4)})
    reference = {}
    for processes in tried:
        name = f"MaxText-style reference, {plural(processes, 'process', 'processes')}"
        figures = once.once(name, lambda p=processes: bench_reference(ref_spec, texts, p), o.say)
        if figures is not None:
            o.say(f"{name}: {figures['tokens_per_s'] / 1e6:.2f} M tokens/s")
        reference[processes] = {**(figures or once.missing[name]), "processes": processes}
    return reference


def _over_reference(ours: dict, reference: dict[int, dict]) -> dict[str, Any]:
    """This pipeline against the best reference that ran (nothing if either has no figures,
    or no reference made a token in its time: its rate is 0, not a measure to divide by)."""
    ran = [r for r in reference.values() if has_figures(r) and r["tokens_per_s"] > 0]
    if not ran or not has_figures(ours):
        return {}
    best_ref = max(ran, key=lambda r: r["tokens_per_s"])
    return {
        "in_process_over_best_reference": ours["tokens_per_s"] / best_ref["tokens_per_s"],
        "best_reference_processes": best_ref["processes"],
    }


def _bench_rounds(spec: PipelineSpec, texts: list[str], call: str, o: _Options) -> Rounds:
    """The limit, this pipeline and each served transport, back to back in every round; a
    transport this host cannot serve is skipped saying why."""
    served_spec = spec.replace(workers={"count": 0})
    rows = {
        "limit": lambda: bench_limit(texts, spec, min_seconds=o.min_seconds, call=call),
        "ours": lambda: bench_pipeline(spec, Parallelism(0, default_threads(0))),
        **{t: (lambda t=t: bench_server(served_spec, t)) for t in o.transports},
    }
    skip = unavailable(o.transports)
    for t, why in skip.items():
        o.say(f"{t}: skipped ({why['skipped']})")
    return run_rounds(rows, o.rounds, skip, o.say)


def _ratios(rounds: Rounds, transports: tuple[str, ...]) -> dict[str, list[float]]:
    """Each round's ratios, from measurements taken back to back in that round."""
    return rounds.ratios(
        {
            "in_process_over_limit": ("ours", "limit"),
            **{f"server_{t}_over_in_process": (t, "ours") for t in transports},
            **{f"server_{t}_over_limit": (t, "limit") for t in transports},
        }
    )


def _add_packing(result: dict[str, Any], spec: PipelineSpec, texts: list[str], say) -> None:
    """Adds the packing comparison's figures and ratios to `result` (or why it failed)."""
    once = Rounds(samples={})
    same = once.once("packing comparison", lambda: compare_packing(spec, texts), say)
    if same is None:
        result["packing_same_order"] = once.missing["packing comparison"]
        return
    say(
        f"first_fit packing efficiency, same order: ours {same['ours']:.4f}, "
        f"reference {same['reference']:.4f}"
    )
    result["ratios"]["packing_efficiency_same_order"] = same["ours"]
    result["ratios"]["reference_packing_efficiency_same_order"] = same["reference"]
    result["packing_same_order"] = same


def run(
    spec: PipelineSpec,
    *,
    min_tokens: int = 8_000_000,
    min_seconds: float = 2.0,
    rounds: int = 5,
    progress: bool = True,
    transports: tuple[str, ...] = ("unix", "tcp"),
    packing: bool = True,
    texts: list[str] | None = None,
    reference_processes: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Runs every measurement on `spec`'s corpus and returns figures and ratios.

    The limit (the fastest of the kind's batch calls, picked by a short run of each), this
    pipeline and the pipeline served over each of `transports` are measured back to back in
    each of `rounds` rounds. A ratio is the median of the rounds' own ratios, so a burst of
    other load on a shared machine skews one round, not the result; each rate reported is its
    best round. The slow reference runs once per worker count (`reference_processes`, default
    0, 1 and the core count), on a quarter of the tokens. `packing=False` leaves out the
    packing comparison; `texts` is the corpus, if read already. A transport this host cannot
    serve (TCP where it refuses TCP) is kept as `{"skipped": why}`, and a measurement that
    raises as `{"failed": why}` (with any rounds it measured before): the others go on.

    Raises:
      SpecError: a mixture, pre-tokenized data or no model: this compares one text source
        with its tokenizer (scripts/bench/bench_mixture.py measures the others).
    """
    check_benchable(spec)
    o = _Options(rounds, min_seconds, transports, packing, progress)
    kind = spec.tokenizer.kind
    texts = corpus_texts(spec) if texts is None else texts
    spec, corpus = _planned(spec, texts, min_tokens, o.say)
    cores = os.cpu_count() or 1
    processes_tried = sorted(set(reference_processes or (0, 1, cores)))
    backend = backend_report(spec, texts, o.say)
    call, tried = _pick_limit(spec, texts, cores, min_seconds, o.say)
    _say_estimate(o, kind, tried[call]["tokens_per_s"], corpus, cores, processes_tried)
    reference = _bench_references(spec, texts, corpus["epochs"], processes_tried, o)
    done = _bench_rounds(spec, texts, call, o)
    ours = done.best("ours")
    per_round = _ratios(done, transports)
    result = {
        "corpus": corpus,
        "spec": dataclasses.asdict(spec.batch),
        "kind": kind,
        "vocab_size": load_tokenizer(spec.tokenizer).info().vocab_size,
        "tokenizer_backend": backend,
        "cores": cores,
        "rounds": rounds,
        "limit": done.best("limit"),
        "limit_calls_tried": {n: r["tokens_per_s"] for n, r in tried.items()},
        "reference": {str(k): v for k, v in reference.items()},
        "reference_encode": REFERENCE_ENCODE[kind],
        "pipeline_in_process": ours,
        "server": {t: done.best(t) for t in transports},
        "ratios": {**medians(per_round), **_over_reference(ours, reference)},
        "ratios_per_round": per_round,
    }
    if packing:
        _add_packing(result, spec, texts, o.say)
    return result


def run_kinds(
    spec: PipelineSpec,
    kinds: tuple[str, ...] = KINDS,
    *,
    min_tokens: int = 8_000_000,
    min_seconds: float = 2.0,
    rounds: int = 3,
    progress: bool = True,
    reference_processes: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """`throughput.run` for each of `kinds` on `spec`'s corpus (a model of each from `make_models`),
    through the server over a Unix socket only and without the packing comparison (the same
    for every kind); returns a row per kind and each kind's whole result.

    Raises:
      SpecError: as `throughput.run`, before any model is trained.
    """
    check_benchable(spec)
    texts = corpus_texts(spec)
    folder = tempfile.mkdtemp(prefix="bench-kinds-")
    try:
        models = make_models(spec, texts, kinds, folder)
        results = {}
        for kind in kinds:
            if progress:
                print(f"[bench] --- {kind}: {models[kind]}", flush=True)
            results[kind] = run(
                spec.replace(tokenizer={"kind": kind, "model": models[kind]}),
                min_tokens=min_tokens,
                min_seconds=min_seconds,
                rounds=rounds,
                progress=progress,
                transports=("unix",),
                packing=False,
                texts=texts,
                reference_processes=reference_processes,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    first = results[kinds[0]]
    return {
        "corpus": {k: v for k, v in first["corpus"].items() if k != "epochs"},
        "spec": first["spec"],
        "cores": first["cores"],
        "rounds": rounds,
        "models": {k: "the spec's" if k == spec.tokenizer.kind else "trained here" for k in kinds},
        "kinds": [row_of(k, results[k]) for k in kinds],
        "results": results,
    }
