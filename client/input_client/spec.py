"""Pipeline specs: the TOML file, its dataclasses, their validation and their proto form.

The client builds and sends specs; the server validates every spec it receives with
`validate`, so both sides share one definition of what is valid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from input_client._spec_checks import (  # noqa: F401  (the constants are this module's API)
    FORMATS,
    MAX_THREADS,
    MAX_TUNE_SECONDS,
    MAX_WORKERS,
    PACKINGS,
    RECORD_FORMATS,
    SpecError,
    validate,
)
from input_client.proto import pb

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from its backport
    import tomli as tomllib


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """Where documents come from: one source, or one component of a mixture.

    Attributes:
      paths: files or glob patterns.
      format: "jsonl" (plain, .gz or .zst), "arrayrecord", "parquet" or "tfrecord" (records
        are tf.train.Example).
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
    format: str = "jsonl"
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
    """The sentencepiece model and the special ids added around each document.

    Without a model (every source pre-tokenized), `vocab_size` bounds the ids, `bos_id` and
    `eos_id` are what `add_bos`/`add_eos` add, and `pad_id` is the id the trainer pads with
    (MaxText's convention: -1 for none). With a model they come from it and stay unset.
    """

    model: str = ""
    add_bos: bool = True
    add_eos: bool = True
    vocab_size: int | None = None
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: v for k, v in out.items() if v is not None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """Batch shape and packing. Defaults follow MaxText's small configs (1024 x 16, first_fit)."""

    seq_len: int = 1024
    size: int = 16
    packing: str = "first_fit"


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


_TABLES: dict[str, type] = {
    "source": SourceSpec,
    "tokenizer": TokenizerSpec,
    "batch": BatchSpec,
    "order": OrderSpec,
    "shard": ShardSpec,
    "workers": WorkersSpec,
}


def _table(name: str, value: Any) -> Any:
    cls = _TABLES[name]
    if isinstance(value, cls):
        return value
    if name == "source" and isinstance(value, (list, tuple)):  # a mixture: [[source]] tables
        if not value:
            raise SpecError("source", [], "must list at least one source")
        return tuple(_table_of(f"source[{i}]", cls, v) for i, v in enumerate(value))
    return _table_of(name, cls, value)


def _table_of(name: str, cls: type, value: Any) -> Any:
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise SpecError(name, value, "must be a table")
    known = {f.name for f in dataclasses.fields(cls)}
    for key in value:
        if key not in known:
            raise SpecError(
                f"{name}.{key}",
                value[key],
                f"is not a key of [{name}] (known: {', '.join(sorted(known))})",
            )
    try:
        return cls(**value)
    except TypeError as e:  # a required key is missing
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in value
        ]
        raise SpecError(f"{name}.{missing[0] if missing else '?'}", None, "is required") from e


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """A whole pipeline: read, tokenize, pack, batch.

    Tables may be given as their dataclasses or as plain dicts with the TOML keys:
    `PipelineSpec(source={"paths": ["data/*.jsonl"]}, tokenizer={"model": "spm.model"})`.
    A mixture gives `source` as a list of tables (TOML's `[[source]]`), each with a `weight`.
    """

    source: SourceSpec | tuple[SourceSpec, ...]
    tokenizer: TokenizerSpec
    batch: BatchSpec = BatchSpec()
    order: OrderSpec = OrderSpec()
    shard: ShardSpec = ShardSpec()
    workers: WorkersSpec = WorkersSpec()

    def __post_init__(self):
        for name in _TABLES:
            object.__setattr__(self, name, _table(name, getattr(self, name)))
        validate(self)  # a spec that exists is a spec that can work

    @classmethod
    def from_dict(cls, tables: Mapping[str, Any]) -> PipelineSpec:
        """Builds a spec from TOML-shaped tables; unknown tables or keys raise `SpecError`."""
        for name in tables:
            if name not in _TABLES:
                raise SpecError(
                    name, tables[name], f"is not a spec table (known: {', '.join(_TABLES)})"
                )
        for name in ("source", "tokenizer"):
            if name not in tables:
                raise SpecError(name, None, "is a required table")
        return cls(**dict(tables))

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> PipelineSpec:
        """Reads a spec file; relative data and model paths resolve against the file's folder."""
        path = os.fspath(path)
        with open(path, "rb") as f:
            try:
                tables = tomllib.load(f)
            except ValueError as e:  # TOMLDecodeError, UnicodeDecodeError, int-digit limit
                raise SpecError("(file)", path, f"is not valid TOML: {e}") from e
        return cls.from_dict(tables).resolve_paths(os.path.dirname(os.path.abspath(path)))

    @property
    def is_mixture(self) -> bool:
        """Whether `source` lists components (`[[source]]`), even a single one."""
        return isinstance(self.source, tuple)

    @property
    def sources(self) -> tuple[SourceSpec, ...]:
        """The components: the one source, or a mixture's."""
        return self.source if isinstance(self.source, tuple) else (self.source,)

    @property
    def all_named(self) -> bool:
        """A mixture whose every component has a name: its resume states survive a change of
        weights."""
        return self.is_mixture and all(s.name for s in self.source)

    def resolve_paths(self, base: str) -> PipelineSpec:
        """Returns a copy whose relative source paths and model path are joined to `base`."""

        def join(p: str) -> str:
            return p if not isinstance(p, str) or os.path.isabs(p) else os.path.join(base, p)

        joined = tuple(
            dataclasses.replace(s, paths=tuple(join(p) for p in s.paths)) for s in self.sources
        )
        model = self.tokenizer.model
        tokenizer = dataclasses.replace(self.tokenizer, model=join(model) if model else model)
        return dataclasses.replace(
            self, source=joined if self.is_mixture else joined[0], tokenizer=tokenizer
        )

    def replace(self, **tables: Mapping[str, Any]) -> PipelineSpec:
        """Returns a copy with some keys changed: `spec.replace(batch={"size": 8})`. A
        mixture's `source` is replaced whole: `spec.replace(source=[{...}, {...}])`."""
        changed = {}
        for name, keys in tables.items():
            if name not in _TABLES:
                raise SpecError(name, keys, "is not a spec table")
            if name == "source" and (self.is_mixture or isinstance(keys, (list, tuple))):
                changed[name] = keys
            else:
                changed[name] = dataclasses.replace(getattr(self, name), **keys)
        return dataclasses.replace(self, **changed)

    def to_dict(self, *, weights: bool = True) -> dict[str, Any]:
        """The TOML tables; a mixture's `source` is a list of them. `weights=False` leaves the
        components' weights out (what a named mixture's resume states are matched by)."""
        out: dict[str, Any] = {
            name: dataclasses.asdict(getattr(self, name))
            for name in _TABLES
            if name not in ("source", "tokenizer")
        }
        sources = [s.to_dict() for s in self.sources]
        if not weights:
            for s in sources:
                s.pop("weight", None)
        out["source"] = sources if self.is_mixture else sources[0]
        out["tokenizer"] = self.tokenizer.to_dict()
        return {name: out[name] for name in _TABLES}

    def to_toml(self) -> str:
        """The spec as a TOML file's text, which `from_toml` reads back to an equal spec."""

        # JSON's strings, numbers, booleans and arrays of strings are TOML's too (a spec's
        # numbers are finite: `validate` refuses the rest), once characters beyond the BMP stay
        # themselves (JSON would write surrogate pairs) and DEL is escaped (TOML's control
        # characters include it; JSON's do not).
        def value(v: Any) -> str:
            return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")

        def table(header: str, t: dict[str, Any]) -> str:
            return f"{header}\n" + "".join(f"{key} = {value(v)}\n" for key, v in t.items())

        out = []
        for name, t in self.to_dict().items():
            if isinstance(t, list):
                out.extend(table(f"[[{name}]]", c) for c in t)
            else:
                out.append(table(f"[{name}]", t))
        return "".join(out)

    def data_fingerprint(self, *, weights: bool = True) -> str:
        """A hash of all that decides the data (all but [workers]), to match resume states;
        `weights=False`: all but the mixture's weights too."""
        tables = self.to_dict(weights=weights)
        del tables["workers"]
        blob = json.dumps(tables, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_proto(self) -> pb.PipelineSpec:
        from input_client._spec_proto import to_proto

        return to_proto(self)

    @classmethod
    def from_proto(cls, msg: pb.PipelineSpec) -> PipelineSpec:
        """Reads the proto form. An empty string or an absent table means the default."""
        from input_client._spec_proto import from_proto

        return from_proto(cls, msg)
