"""What `bench` checks before it times: that the spec is one it compares (`check_benchable`),
and who tokenizes (`backend_report`): the backend the gate chose for the spec's model, why,
and every document of the corpus encoded by it and by the reference, compared id for id (the
benchmark's rates count only if the ids are the reference's)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from input_client.spec import PipelineSpec, SpecError
from input_server.data.tokenizers import load_tokenizer

GROUP = 256  # documents a call, as a pipeline's groups hold about


def check_benchable(spec: PipelineSpec) -> None:
    """Raises SpecError unless `spec` is one text source with a tokenizer model."""
    if spec.is_mixture or spec.source.token_field or not spec.tokenizer.model:
        raise SpecError(
            "source",
            "a mixture" if spec.is_mixture else spec.source.to_dict(),
            "must be one text source with a `tokenizer.model` for `input-server bench`, which "
            "compares it with its tokenizer; scripts/bench/bench_mixture.py measures mixtures and "
            "pre-tokenized data",
        )


def backend_report(spec: PipelineSpec, texts: list[str], say=lambda _: None) -> dict[str, Any]:
    """The backend chosen on the corpus's first documents (as a pipeline chooses on its
    sample), why, and how many of the corpus's documents it gives other ids than the
    reference (with BOS/EOS as the spec says, whole documents)."""
    tokenizer = load_tokenizer(spec.tokenizer, audit_every=0)  # compared here, every document
    choice = tokenizer.choose_backend(texts[:64])
    reference = load_tokenizer(dataclasses.replace(spec.tokenizer, backend="reference"))
    reference.choose_backend([])
    differing = tokens = fell_back = 0
    cpu = {"backend": 0.0, "reference": 0.0}
    router = tokenizer.router
    fast = router.serving_backend()
    if fast is not None:
        for i in range(0, len(texts), GROUP):
            started = time.process_time()
            try:  # the backend alone: no audit, no group sent to the reference unseen
                a = router.backend_group(fast, texts[i : i + GROUP], i, None)
            except Exception:  # noqa: BLE001 - what serving sends to the reference: counted
                a = router.reference_group(texts[i : i + GROUP], i, None)
                fell_back += len(texts[i : i + GROUP])
            between = time.process_time()
            b = reference.encode(texts[i : i + GROUP], i)
            cpu["backend"] += between - started
            cpu["reference"] += time.process_time() - between
            tokens += len(b.tokens)
            if not a.same_ids(b):
                differing += sum(
                    not (x == y).all() if len(x) == len(y) else 1
                    for x, y in zip(_docs(a), _docs(b), strict=True)
                )
    cost = (
        f"; CPU a token: {1e9 * cpu['backend'] / tokens:.0f} ns, the reference "
        f"{1e9 * cpu['reference'] / tokens:.0f} ns"
        if tokens
        else ""
    )
    say(
        f"tokenizer backend: {choice.backend} ({choice.why}); "
        f"{differing} of {len(texts)} documents differ from the reference's ids{cost}"
    )
    return {
        "backend": choice.backend,
        "why": choice.why,
        "documents_compared": len(texts) if choice.backend != "reference" else 0,
        "documents_differing": differing,
        "documents_the_backend_could_not_take": fell_back,
        # Each document encoded once by each (a backend's caches warm across calls: no
        # document twice), on one thread, groups as a pipeline's: the CPU a token of each.
        **{f"{k}_cpu_ns_per_token": 1e9 * v / tokens if tokens else None for k, v in cpu.items()},
    }


def _docs(group):
    ends = group.starts + group.lengths
    return [group.tokens[s:e] for s, e in zip(group.starts.tolist(), ends.tolist(), strict=True)]
