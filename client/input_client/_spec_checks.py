"""What makes a spec valid: every key's check, with a message naming the key and its value.

Shared by the client (a spec that exists is valid) and the server (which validates every spec
it receives), so both sides keep one definition.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from input_client import formats

# Defined in the public `errors` module, so tracebacks name its public home.
from input_client.errors import SpecError

# The spec's types are not imported: `spec` imports this module. Annotations name them.
PipelineSpec = SourceSpec = TokenizerSpec = Any

# The names and record formats of `formats`' table, under the names `spec` always gave them.
FORMATS = formats.NAMES
RECORD_FORMATS = formats.RECORD_FORMATS
PACKINGS = ("first_fit", "concat_then_split", "none")
LONG_DOCUMENTS = ("trim", "chunk", "split")
TOKENIZER_KINDS = ("sentencepiece", "huggingface", "tiktoken", "tekken")
# Who tokenizes (`input_server.data.tokenizers.backends` says which serve which kind).
TOKENIZER_BACKENDS = ("auto", "reference", "fastokens", "kitoken")
MAX_WORKERS = 1024
# A stream serves while it tunes (online), but a search that long would leave the loop
# underfed for as long: ten minutes is already far too long.
MAX_TUNE_SECONDS = 600
MAX_THREADS = 256
# A mixture's interleave repeats every 2^16 documents (`input_server.data.mixture`): a
# component's share is kept to 1/2^16 of the whole, and one below that could not be kept.
MIX_PERIOD = 1 << 16
MAX_COMPONENTS = 4096
# Weights are relative; a bound keeps their sum a float (1e308 twice overflows it).
MAX_WEIGHT = 1e12


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(ok: bool, key: str, value: Any, reason: str) -> None:
    if not ok:
        raise SpecError(key, value, reason)


def source_key(spec: PipelineSpec, i: int) -> str:
    """How messages name component `i`: `source` alone, `source[i]` in a mixture."""
    return f"source[{i}]" if spec.is_mixture else "source"


def _source(s: SourceSpec, key: str) -> None:
    _check(
        isinstance(s.paths, tuple) and len(s.paths) > 0,
        f"{key}.paths",
        s.paths,
        "must list at least one file or glob",
    )
    for p in s.paths:
        _check(isinstance(p, str) and p != "", f"{key}.paths", p, "must hold non-empty strings")
        _check("\x00" not in p, f"{key}.paths", p, "must not hold a NUL character")
    _check(
        s.format != "",
        f"{key}.format",
        s.format,
        f"is left out, and `{key}.paths` mix plain-text names (.txt, .txt.gz, .txt.zst) with "
        f"others, so it cannot be inferred: set it, or give each kind of file its own "
        f"[[source]]",
    )
    _check(s.format in FORMATS, f"{key}.format", s.format, f"must be one of {', '.join(FORMATS)}")
    form = formats.FORMATS[s.format]
    _refused_keys(s, key, form)
    _check(
        isinstance(s.text_field, str) and s.text_field != "",
        f"{key}.text_field",
        s.text_field,
        "must be a non-empty string",
    )
    _check(
        isinstance(s.token_field, str) and "\x00" not in s.token_field,
        f"{key}.token_field",
        s.token_field,
        "must be a string (empty: the documents are text)",
    )
    _check(
        s.record_format in RECORD_FORMATS,
        f"{key}.record_format",
        s.record_format,
        f"must be one of {', '.join(RECORD_FORMATS)}",
    )
    if form.check is not None:
        form.check(s, key)
    _check(
        _is_number(s.weight) and 0 < s.weight <= MAX_WEIGHT,
        f"{key}.weight",
        s.weight,
        f"must be a number above 0 and at most {MAX_WEIGHT:g} (weights count documents)",
    )
    _check(
        isinstance(s.name, str) and "\x00" not in s.name and len(s.name) <= 256,
        f"{key}.name",
        s.name,
        "must be a string of at most 256 characters",
    )


def _refused_keys(s: SourceSpec, key: str, form: formats.Format) -> None:
    """A key the format refuses keeps its default: set, it is a spec written for another
    format, refused rather than silently ignored."""
    defaults = {f.name: f.default for f in dataclasses.fields(s)}
    for field, reason in form.refuses.items():
        value = getattr(s, field)
        _check(value == defaults[field], f"{key}.{field}", value, reason)


def _mixture(spec: PipelineSpec) -> None:
    sources = spec.sources
    _check(
        0 < len(sources) <= MAX_COMPONENTS,
        "source",
        list(sources),
        f"must list from 1 to {MAX_COMPONENTS} sources",
    )
    names: dict[str, int] = {}
    for i, s in enumerate(sources):
        _source(s, source_key(spec, i))
        if s.name:
            _check(
                s.name not in names,
                f"source[{i}].name",
                s.name,
                f"repeats the name of source[{names.get(s.name)}]; names must be unique",
            )
            names[s.name] = i
    total = math.fsum(s.weight for s in sources)
    for i, s in enumerate(sources):
        _check(
            s.weight / total >= 1 / MIX_PERIOD,
            f"{source_key(spec, i)}.weight",
            s.weight,
            f"is below 1/{MIX_PERIOD} of all the weights ({total:g}), a share no "
            f"interleave of {MIX_PERIOD} documents can keep",
        )


def _tokenizer(spec: PipelineSpec) -> None:
    t: TokenizerSpec = spec.tokenizer
    _check(
        t.kind in TOKENIZER_KINDS,
        "tokenizer.kind",
        t.kind,
        f"must be one of {', '.join(TOKENIZER_KINDS)}",
    )
    _check(
        t.backend in TOKENIZER_BACKENDS,
        "tokenizer.backend",
        t.backend,
        f"must be one of {', '.join(TOKENIZER_BACKENDS)}",
    )
    _check(
        isinstance(t.model, str) and "\x00" not in t.model,
        "tokenizer.model",
        t.model,
        f"must name a {t.kind} model file",
    )
    _check(isinstance(t.add_bos, bool), "tokenizer.add_bos", t.add_bos, "must be true or false")
    _check(isinstance(t.add_eos, bool), "tokenizer.add_eos", t.add_eos, "must be true or false")
    for key in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        v = getattr(t, key)
        _check(
            v is None or (_is_int(v) and -1 <= v < 1 << 31),
            f"tokenizer.{key}",
            v,
            "must be an integer from -1 to 2^31 - 1",
        )
    if t.model:
        for key in ("vocab_size", "pad_id", "bos_id", "eos_id"):
            _check(
                getattr(t, key) is None,
                f"tokenizer.{key}",
                getattr(t, key),
                "comes from `tokenizer.model`; give it only without a model",
            )
        return
    for i, s in enumerate(spec.sources):
        _check(
            bool(s.token_field),
            "tokenizer.model",
            t.model,
            f"must name a {t.kind} model file: `{source_key(spec, i)}` is text (no `token_field`)",
        )
    _check(
        t.vocab_size is not None and t.vocab_size >= 1,
        "tokenizer.vocab_size",
        t.vocab_size,
        "is required without a `tokenizer.model`: ids are checked to lie below it",
    )
    for key, needed in (("bos_id", t.add_bos), ("eos_id", t.add_eos)):
        v = getattr(t, key)
        if needed:
            _check(
                v is not None and 0 <= v < t.vocab_size,
                f"tokenizer.{key}",
                v,
                f"is required with `tokenizer.add_{key[:3]}` and no model: an id below "
                f"`tokenizer.vocab_size` {t.vocab_size}",
            )
    _check(
        t.pad_id is None or t.pad_id < t.vocab_size,
        "tokenizer.pad_id",
        t.pad_id,
        f"must be -1 (none) or an id below `tokenizer.vocab_size` {t.vocab_size}",
    )


def validate(spec: PipelineSpec) -> None:
    """Checks every key's value; raises `SpecError` naming the first bad key and its value.

    File existence is the server's business (NOT_FOUND), not checked here.
    """
    b, o, sh = spec.batch, spec.order, spec.shard
    _mixture(spec)
    _tokenizer(spec)
    _check(
        _is_int(b.seq_len) and 2 <= b.seq_len <= 1 << 20,
        "batch.seq_len",
        b.seq_len,
        "must be an integer from 2 to 1048576",
    )
    _check(
        _is_int(b.size) and 1 <= b.size <= 1 << 16,
        "batch.size",
        b.size,
        "must be an integer from 1 to 65536",
    )
    _check(
        b.packing in PACKINGS, "batch.packing", b.packing, f"must be one of {', '.join(PACKINGS)}"
    )
    _check(
        b.long_documents in ("", *LONG_DOCUMENTS),
        "batch.long_documents",
        b.long_documents,
        f"must be one of {', '.join(LONG_DOCUMENTS)}",
    )
    _check(
        b.long_documents != "split" or b.packing == "concat_then_split",
        "batch.long_documents",
        b.long_documents,
        "may be split only with `batch.packing` concat_then_split (a document runs on "
        "from row to row); use trim or chunk",
    )
    _check(
        _is_int(o.seed) and 0 <= o.seed < 1 << 63,
        "order.seed",
        o.seed,
        "must be a non-negative integer",
    )
    _check(isinstance(o.shuffle, bool), "order.shuffle", o.shuffle, "must be true or false")
    _check(
        _is_int(o.epochs) and o.epochs >= 0,
        "order.epochs",
        o.epochs,
        "must be a non-negative integer (0 = repeat forever)",
    )
    _check(
        _is_int(sh.count) and sh.count >= 1, "shard.count", sh.count, "must be a positive integer"
    )
    _check(
        _is_int(sh.index) and 0 <= sh.index < sh.count,
        "shard.index",
        sh.index,
        f"must be an integer from 0 to shard.count - 1 = {sh.count - 1}",
    )
    _workers(spec)


def _workers(spec: PipelineSpec) -> None:
    w = spec.workers
    _check(
        w.count == "auto" or (_is_int(w.count) and 0 <= w.count <= MAX_WORKERS),
        "workers.count",
        w.count,
        f'must be "auto" or an integer from 0 to {MAX_WORKERS}',
    )
    _check(
        _is_int(w.ram_budget_mb) and w.ram_budget_mb >= 1,
        "workers.ram_budget_mb",
        w.ram_budget_mb,
        "must be a positive integer (MiB)",
    )
    _check(
        _is_int(w.max_workers) and 0 <= w.max_workers <= MAX_WORKERS,
        "workers.max_workers",
        w.max_workers,
        f"must be an integer from 0 (no cap) to {MAX_WORKERS}",
    )
    _check(
        _is_number(w.target_batches_per_s) and 0 <= w.target_batches_per_s < math.inf,
        "workers.target_batches_per_s",
        w.target_batches_per_s,
        "must be a non-negative number (batches/s; 0 = unknown)",
    )
    _check(
        _is_int(w.threads) and 0 <= w.threads <= MAX_THREADS,
        "workers.threads",
        w.threads,
        f"must be an integer from 0 (the default) to {MAX_THREADS}",
    )
    _check(
        w.threads == 0 or w.count != "auto",
        "workers.threads",
        w.threads,
        'must be 0 with workers.count = "auto" (which picks threads itself); set a count '
        "to fix both",
    )
    _check(
        _is_number(w.tune_seconds) and 0 < w.tune_seconds <= MAX_TUNE_SECONDS,
        "workers.tune_seconds",
        w.tune_seconds,
        f"must be a number of seconds above 0 and at most {MAX_TUNE_SECONDS}",
    )
