"""Pipeline specs: the TOML file, its dataclasses, their validation and their proto form.

The client builds and sends specs; the server validates every spec it receives with
`validate`, so both sides share one definition of what is valid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Mapping
from typing import Any

from input_client.proto import pb

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from its backport
    import tomli as tomllib

FORMATS = ("jsonl", "arrayrecord", "parquet")
RECORD_FORMATS = ("json", "text", "tf_example")
PACKINGS = ("first_fit", "concat_then_split", "none")
MAX_WORKERS = 1024
# A stream serves while it tunes (online), but a search that long would leave the loop
# underfed for as long: ten minutes is already far too long.
MAX_TUNE_SECONDS = 600
MAX_THREADS = 256


class SpecError(ValueError):
    """A spec key holds a value that cannot work; `key` is the dotted key, e.g. `batch.size`."""

    def __init__(self, key: str, value: Any, reason: str):
        self.key = key
        self.value = value
        shown = repr(value)
        if len(shown) > 80:  # a 5,000-digit number is named, not printed
            shown = f"{shown[:40]}...{shown[-20:]} ({len(shown)} characters)"
        super().__init__(f"`{key}` {reason}, got {shown}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """Where documents come from.

    Attributes:
      paths: files or glob patterns.
      format: "jsonl" (plain, .gz or .zst), "arrayrecord" or "parquet".
      text_field: JSON key or Parquet column holding the text (MaxText's default "text").
      record_format: ArrayRecord only: "json", "text" or "tf_example".
    """

    paths: tuple[str, ...]
    format: str = "jsonl"
    text_field: str = "text"
    record_format: str = "json"

    def __post_init__(self):
        if isinstance(self.paths, str):
            object.__setattr__(self, "paths", (self.paths,))
        elif isinstance(self.paths, (list, tuple)):
            object.__setattr__(self, "paths", tuple(self.paths))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """The sentencepiece model and the special ids added around each document."""

    model: str
    add_bos: bool = True
    add_eos: bool = True


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
    """

    source: SourceSpec
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

    def resolve_paths(self, base: str) -> PipelineSpec:
        """Returns a copy whose relative source paths and model path are joined to `base`."""

        def join(p: str) -> str:
            return p if not isinstance(p, str) or os.path.isabs(p) else os.path.join(base, p)

        source = dataclasses.replace(self.source, paths=tuple(join(p) for p in self.source.paths))
        tokenizer = dataclasses.replace(self.tokenizer, model=join(self.tokenizer.model))
        return dataclasses.replace(self, source=source, tokenizer=tokenizer)

    def replace(self, **tables: Mapping[str, Any]) -> PipelineSpec:
        """Returns a copy with some keys changed: `spec.replace(batch={"size": 8})`."""
        changed = {}
        for name, keys in tables.items():
            if name not in _TABLES:
                raise SpecError(name, keys, "is not a spec table")
            changed[name] = dataclasses.replace(getattr(self, name), **keys)
        return dataclasses.replace(self, **changed)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        out = {name: dataclasses.asdict(getattr(self, name)) for name in _TABLES}
        out["source"]["paths"] = list(self.source.paths)
        return out

    def to_toml(self) -> str:
        """The spec as a TOML file's text, which `from_toml` reads back to an equal spec."""

        # JSON's strings, numbers, booleans and arrays of strings are TOML's too (a spec's
        # numbers are finite: `validate` refuses the rest), once characters beyond the BMP stay
        # themselves (JSON would write surrogate pairs) and DEL is escaped (TOML's control
        # characters include it; JSON's do not).
        def value(v: Any) -> str:
            return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")

        return "".join(
            f"[{name}]\n" + "".join(f"{key} = {value(v)}\n" for key, v in t.items())
            for name, t in self.to_dict().items()
        )

    def data_fingerprint(self) -> str:
        """A hash of all that decides the data (all but [workers]), to match resume states."""
        tables = self.to_dict()
        del tables["workers"]
        blob = json.dumps(tables, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_proto(self) -> pb.PipelineSpec:
        s, t, b, o, sh, w = (
            self.source,
            self.tokenizer,
            self.batch,
            self.order,
            self.shard,
            self.workers,
        )
        return pb.PipelineSpec(
            source=pb.Source(
                paths=list(s.paths),
                format=s.format,
                text_field=s.text_field,
                record_format=s.record_format,
            ),
            tokenizer=pb.Tokenizer(model=t.model, add_bos=t.add_bos, add_eos=t.add_eos),
            batch=pb.BatchShape(seq_len=b.seq_len, size=b.size, packing=b.packing),
            order=pb.Order(seed=o.seed, shuffle=o.shuffle, epochs=o.epochs),
            shard=pb.Shard(index=sh.index, count=sh.count),
            workers=pb.Workers(
                count=str(w.count),
                ram_budget_mb=w.ram_budget_mb,
                max_workers=w.max_workers,
                target_batches_per_s=w.target_batches_per_s,
                tune_seconds=w.tune_seconds,
                threads=w.threads,
            ),
        )

    @classmethod
    def from_proto(cls, msg: pb.PipelineSpec) -> PipelineSpec:
        """Reads the proto form. An empty string or an absent table means the default."""

        def pick(present: bool, value: Any, default: Any) -> Any:
            return value if present else default

        s, t, b, o, sh, w = msg.source, msg.tokenizer, msg.batch, msg.order, msg.shard, msg.workers
        d_batch, d_workers = BatchSpec(), WorkersSpec()
        count: int | str = w.count or d_workers.count
        # ASCII digits only ("²".isdigit() holds), and few enough to be a count: anything
        # else stays a string, which validation refuses by name.
        if count.isascii() and count.isdigit() and len(count) <= 9:
            count = int(count)
        return cls(
            source=SourceSpec(
                paths=tuple(s.paths),
                format=s.format or "jsonl",
                text_field=s.text_field or "text",
                record_format=s.record_format or "json",
            ),
            tokenizer=TokenizerSpec(model=t.model, add_bos=t.add_bos, add_eos=t.add_eos),
            batch=BatchSpec(
                seq_len=pick(msg.HasField("batch"), b.seq_len, d_batch.seq_len),
                size=pick(msg.HasField("batch"), b.size, d_batch.size),
                packing=b.packing or d_batch.packing,
            ),
            order=OrderSpec(
                **(
                    {"seed": o.seed, "shuffle": o.shuffle, "epochs": o.epochs}
                    if msg.HasField("order")
                    else {}
                )
            ),
            shard=ShardSpec(
                **({"index": sh.index, "count": sh.count} if msg.HasField("shard") else {})
            ),
            workers=WorkersSpec(
                count=count,
                ram_budget_mb=w.ram_budget_mb or d_workers.ram_budget_mb,
                max_workers=w.max_workers,
                target_batches_per_s=w.target_batches_per_s,
                tune_seconds=w.tune_seconds or d_workers.tune_seconds,
                threads=w.threads,
            ),
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(ok: bool, key: str, value: Any, reason: str) -> None:
    if not ok:
        raise SpecError(key, value, reason)


def validate(spec: PipelineSpec) -> None:
    """Checks every key's value; raises `SpecError` naming the first bad key and its value.

    File existence is the server's business (NOT_FOUND), not checked here.
    """
    s, t, b, o = spec.source, spec.tokenizer, spec.batch, spec.order
    sh, w = spec.shard, spec.workers
    _check(
        isinstance(s.paths, tuple) and len(s.paths) > 0,
        "source.paths",
        s.paths,
        "must list at least one file or glob",
    )
    for p in s.paths:
        _check(isinstance(p, str) and p != "", "source.paths", p, "must hold non-empty strings")
        _check("\x00" not in p, "source.paths", p, "must not hold a NUL character")
    _check(s.format in FORMATS, "source.format", s.format, f"must be one of {', '.join(FORMATS)}")
    _check(
        isinstance(s.text_field, str) and s.text_field != "",
        "source.text_field",
        s.text_field,
        "must be a non-empty string",
    )
    _check(
        s.record_format in RECORD_FORMATS,
        "source.record_format",
        s.record_format,
        f"must be one of {', '.join(RECORD_FORMATS)}",
    )
    _check(
        isinstance(t.model, str) and t.model != "" and "\x00" not in t.model,
        "tokenizer.model",
        t.model,
        "must name a sentencepiece model file",
    )
    _check(isinstance(t.add_bos, bool), "tokenizer.add_bos", t.add_bos, "must be true or false")
    _check(isinstance(t.add_eos, bool), "tokenizer.add_eos", t.add_eos, "must be true or false")
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
