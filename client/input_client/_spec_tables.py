"""The tables of a pipeline spec, one dataclass each (`spec.PipelineSpec` holds them)."""

from __future__ import annotations

import dataclasses
from typing import Any

# Names a source of plain text takes (as `input-server tokenizer train` reads them).
TEXT_NAMES = (".txt", ".txt.gz", ".txt.zst", ".txt.zstd")


def inferred_format(paths: Any) -> str:
    """The format of a source whose `format` is left out: "text" when every path or glob
    ends in a plain-text name (`TEXT_NAMES`), "jsonl" when none does (what a source was
    before there was a choice, so such a spec keeps its fingerprint), "" when they disagree
    (refused by validation: a guess would read some files wrongly)."""
    names = [p for p in paths if isinstance(p, str)] if isinstance(paths, tuple) else []
    text = [p.endswith(TEXT_NAMES) for p in names]
    if text and all(text):
        return "text"
    return "" if any(text) else "jsonl"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """Where documents come from: one source, or one component of a mixture.

    Attributes:
      paths: files or glob patterns.
      format: "jsonl" (plain, .gz or .zst), "text" (a document a line; plain, .gz or .zst),
        "arrayrecord", "parquet" or "tfrecord" (records are tf.train.Example). Left out (""),
        it is inferred from the paths' names (`inferred_format`).
      text_field: JSON key, Parquet column or Example feature holding the text (MaxText's
        default "text").
      token_field: pre-tokenized documents: the key, column or int64 feature holding each
        document's token ids; "" = the documents are text.
      record_format: ArrayRecord only: "json", "text" or "tf_example".
      weight: in a mixture, the component's share of documents relative to the others'
        (weights count documents, as Grain's `mix` and MaxText's mixtures do).
      name: in a mixture, optional and unique; with every component named, a resume state
        survives a change of weights (each component continues where it was).
    """

    paths: tuple[str, ...]
    format: str = ""
    text_field: str = "text"
    token_field: str = ""
    record_format: str = "json"
    weight: float = 1.0
    name: str = ""

    def __post_init__(self):
        if isinstance(self.paths, str):
            object.__setattr__(self, "paths", (self.paths,))
        elif isinstance(self.paths, (list, tuple)):
            object.__setattr__(self, "paths", tuple(self.paths))
        if self.format == "":  # left as "" when the names disagree: validation says so
            object.__setattr__(self, "format", inferred_format(self.paths))

    def to_dict(self) -> dict[str, Any]:
        """The TOML keys; the keys added with mixtures only where they are set, so a spec
        written before them keeps its fingerprint (and its resume states)."""
        out = dataclasses.asdict(self)
        out["paths"] = list(self.paths)
        for key, default in (("token_field", ""), ("weight", 1.0), ("name", "")):
            if out[key] == default:
                del out[key]
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """The tokenizer and the special ids added around each document.

    `kind` says what `model` is, as MaxText's `tokenizer_type`: "sentencepiece" (a `.model`
    file), "huggingface" (a `tokenizer.json`, or a folder holding it and, as Hugging Face
    saves one, its `tokenizer_config.json`) or "tiktoken" (a tiktoken BPE file, read with
    MaxText's Llama 3 pattern and special tokens); or "tekken", which MaxText does not name
    (Mistral's `tekken.json`, read as mistral-common's `Tekkenizer` reads it).

    `backend` says who tokenizes: "auto" (a fast library proved exact for the model by the
    server's gate and audited while serving, else the reference), "reference" (the kind's own
    library: sentencepiece, tokenizers, tiktoken; tiktoken for tekken) or a backend by name
    ("fastokens", "kitoken"); a backend serves only the reference's ids as far as its gate and
    audits show (docs/spec.md), so it is not part of the data.

    Without a model (every source pre-tokenized), `vocab_size` bounds the ids, `bos_id` and
    `eos_id` are what `add_bos`/`add_eos` add, and `pad_id` is the id the trainer pads with
    (MaxText's convention: -1 for none). With a model they come from it and stay unset.
    """

    model: str = ""
    kind: str = "sentencepiece"
    add_bos: bool = True
    add_eos: bool = True
    vocab_size: int | None = None
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    backend: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        """The TOML keys; `kind` only when not sentencepiece and `backend` only when not auto,
        so a spec written before them keeps its fingerprint."""
        out = dataclasses.asdict(self)
        if out["kind"] == "sentencepiece":
            del out["kind"]
        if out["backend"] == "auto":
            del out["backend"]
        return {k: v for k, v in out.items() if v is not None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """Batch shape and packing. Defaults follow MaxText's small configs (1024 x 16, first_fit).

    `long_documents` says what becomes of a document longer than `seq_len`:
      "trim": only its first `seq_len` tokens are kept (MaxText's `use_truncation=true`,
        `TokenizeAndTrim`); the default of first_fit and none.
      "chunk": it is cut into pieces of `seq_len` tokens (the last one shorter), each packed
        as a document of its own (MaxText's `use_truncation=false`, `TokenizeAndChunk`).
      "split": concat_then_split only, its default: the document runs on from row to row,
        a new segment in each.
    "" = the packing's default.
    """

    seq_len: int = 1024
    size: int = 16
    packing: str = "first_fit"
    long_documents: str = ""

    @property
    def long_documents_policy(self) -> str:
        """`long_documents` with the packing's default filled in."""
        if self.long_documents:
            return self.long_documents
        return "split" if self.packing == "concat_then_split" else "trim"

    def to_dict(self) -> dict[str, Any]:
        """The TOML keys; `long_documents` only where it is not the packing's default, so a
        spec written before it keeps its fingerprint, and "trim" written out or left out
        give the same fingerprint (and so accept the same resume states)."""
        out = dataclasses.asdict(self)
        default = "split" if self.packing == "concat_then_split" else "trim"
        if out["long_documents"] in ("", default):
            del out["long_documents"]
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class OrderSpec:
    """Document order; `epochs = 0` repeats forever."""

    seed: int = 0
    shuffle: bool = True
    epochs: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardSpec:
    """This stream reads documents `index, index + count, ...` (one shard per data host)."""

    index: int = 0
    count: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkersSpec:
    """Parallelism of the per-document work. Never changes the data.

    A "worker" is one document group being read and tokenized at a time: a fixed `count`
    runs `count` processes (0 = inside the server process) with the default threads each;
    "auto" measures the pipeline and picks both, processes and threads per process
    (workers = max(1, processes) x threads).

    Attributes:
      count: "auto" or worker processes (0 = inside the server process).
      ram_budget_mb: memory the workers may use (Grain's `pick_performance_config` default is
        per call; 1 GiB keeps a sidecar well inside a TPU host's memory). "auto" checks it
        against the measured RSS of each candidate.
      max_workers: "auto" only: at most this many workers; 0 = no cap beyond what the
        measurement supports.
      target_batches_per_s: "auto" only: the consumer's demand; the fewest workers that meet it
        are chosen, leaving the rest of the host's CPUs to training. 0 = unknown: the
        throughput plateau is chosen.
      tune_seconds: "auto" only: the most time the live search may take (the stream serves
        from its first moment meanwhile; a plateau usually ends it in a few seconds).
      threads: with a fixed `count`, threads per process (0 = the default: the cores shared
        among the processes, at most 8); what `input-server tune` suggests, to fix its whole
        choice. Must be 0 with "auto".
    """

    count: int | str = "auto"
    ram_budget_mb: int = 1024
    max_workers: int = 0
    target_batches_per_s: float = 0.0
    tune_seconds: float = 20.0
    threads: int = 0
