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

from input_client import _spec_proto
from input_client._spec_checks import (  # noqa: F401  (the constants are this module's API)
    FORMATS,
    MAX_THREADS,
    MAX_TUNE_SECONDS,
    MAX_WORKERS,
    MIX_PERIOD,
    PACKINGS,
    RECORD_FORMATS,
    TOKENIZER_BACKENDS,
    TOKENIZER_KINDS,
    SpecError,
    validate,
)
from input_client._spec_tables import (
    BatchSpec,
    OrderSpec,
    ShardSpec,
    SourceSpec,
    TokenizerSpec,
    WorkersSpec,
    inferred_format,
)
from input_client.proto import pb

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from its backport
    import tomli as tomllib


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


def _refollow(name: str, spec: PipelineSpec, keys: Mapping[str, Any]) -> Mapping[str, Any]:
    """`keys` for `replace`: new source paths with the format left out take the format their
    names say when the old one was what the old names said (inferred, or written as inferred);
    a format that differs from the names (JSON lines in .txt files) is kept."""
    old = spec.source
    if name != "source" or "paths" not in keys or "format" in keys:
        return keys
    if old.format != inferred_format(old.paths):
        return keys
    return {**keys, "format": ""}


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
                raise SpecError("(file)", path, f"is not valid TOML: {e}") from None
        try:
            spec = cls.from_dict(tables)
        except SpecError as e:
            # Raised from here, not deep in the checks: a script's traceback is its own line
            # and this one, and the message names the file to fix.
            raise e.in_file(path) from None
        return spec.resolve_paths(os.path.dirname(os.path.abspath(path)))

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
                changed[name] = dataclasses.replace(
                    getattr(self, name), **_refollow(name, self, keys)
                )
        return dataclasses.replace(self, **changed)

    def to_dict(self, *, weights: bool = True) -> dict[str, Any]:
        """The TOML tables; a mixture's `source` is a list of them. `weights=False` leaves the
        components' weights out (what a named mixture's resume states are matched by)."""
        out: dict[str, Any] = {
            name: dataclasses.asdict(getattr(self, name))
            for name in _TABLES
            if name not in ("source", "tokenizer", "batch")
        }
        out["batch"] = self.batch.to_dict()
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

    def data_fingerprint(self, *, weights: bool = True, shard: ShardSpec | None = None) -> str:
        """A hash of all that decides the data (all but [workers]), to match resume states;
        `weights=False`: all but the mixture's weights too; `shard`: as if on that shard (a
        resharded state's old hosts', without building a spec for each)."""
        tables = self.to_dict(weights=weights)
        del tables["workers"]
        if shard is not None:
            tables["shard"] = dataclasses.asdict(shard)
        tables["tokenizer"].pop("backend", None)  # who tokenizes: the ids are the same
        blob = json.dumps(tables, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_proto(self) -> pb.PipelineSpec:
        return _spec_proto.to_proto(self)

    @classmethod
    def from_proto(cls, msg: pb.PipelineSpec) -> PipelineSpec:
        """Reads the proto form. An empty string or an absent table means the default."""
        return _spec_proto.from_proto(cls, msg)
