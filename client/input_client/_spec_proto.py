"""A spec's proto form (`pb.PipelineSpec`), both ways: what the client sends, what the server
reads. An empty string or an absent table means the default."""

from __future__ import annotations

from typing import Any

from input_client._spec_checks import SpecError
from input_client._spec_tables import (
    BatchSpec,
    OrderSpec,
    ShardSpec,
    SourceSpec,
    TokenizerSpec,
    WorkersSpec,
)
from input_client.proto import pb


def _source(s) -> pb.Source:
    return pb.Source(
        paths=list(s.paths),
        format=s.format,
        text_field=s.text_field,
        token_field=s.token_field,
        record_format=s.record_format,
        weight=s.weight,
        name=s.name,
    )


def to_proto(spec: Any) -> pb.PipelineSpec:
    """`spec`: a `PipelineSpec`."""
    t, b, o, sh, w = spec.tokenizer, spec.batch, spec.order, spec.shard, spec.workers
    tables: dict[str, Any] = {}
    if spec.is_mixture:
        tables["mixture"] = [_source(s) for s in spec.sources]
    else:
        tables["source"] = _source(spec.source)
    ids = {k: getattr(t, k) for k in ("pad_id", "bos_id", "eos_id") if getattr(t, k) is not None}
    return pb.PipelineSpec(
        **tables,
        tokenizer=pb.Tokenizer(
            model=t.model,
            kind="" if t.kind == "sentencepiece" else t.kind,
            backend="" if t.backend == "auto" else t.backend,
            add_bos=t.add_bos,
            add_eos=t.add_eos,
            vocab_size=t.vocab_size or 0,
            **ids,
        ),
        batch=pb.BatchShape(
            seq_len=b.seq_len, size=b.size, packing=b.packing, long_documents=b.long_documents
        ),
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


def _source_spec(s: pb.Source) -> SourceSpec:
    return SourceSpec(
        paths=tuple(s.paths),
        format=s.format,  # "": inferred from the paths, as in a TOML file
        text_field=s.text_field or "text",
        token_field=s.token_field,
        record_format=s.record_format or "json",
        weight=s.weight or 1.0,  # 0 is proto3's "unset"
        name=s.name,
    )


def from_proto(cls: type, msg: pb.PipelineSpec) -> Any:
    """`cls`: `PipelineSpec`, which validates what it is given."""

    def pick(present: bool, value: Any, default: Any) -> Any:
        return value if present else default

    t, b, o, sh, w = msg.tokenizer, msg.batch, msg.order, msg.shard, msg.workers
    if msg.mixture and msg.HasField("source"):
        raise SpecError("source", "(a mixture too)", "must be left unset with `mixture`")
    source = (
        tuple(_source_spec(s) for s in msg.mixture) if msg.mixture else _source_spec(msg.source)
    )
    d_batch, d_workers = BatchSpec(), WorkersSpec()
    count: int | str = w.count or d_workers.count
    # ASCII digits only ("²".isdigit() holds), and few enough to be a count: anything
    # else stays a string, which validation refuses by name.
    if count.isascii() and count.isdigit() and len(count) <= 9:
        count = int(count)
    return cls(
        source=source,
        tokenizer=TokenizerSpec(
            model=t.model,
            kind=t.kind or "sentencepiece",
            backend=t.backend or "auto",
            add_bos=t.add_bos,
            add_eos=t.add_eos,
            vocab_size=t.vocab_size or None,
            **{k: getattr(t, k) for k in ("pad_id", "bos_id", "eos_id") if t.HasField(k)},
        ),
        batch=BatchSpec(
            seq_len=pick(msg.HasField("batch"), b.seq_len, d_batch.seq_len),
            size=pick(msg.HasField("batch"), b.size, d_batch.size),
            packing=b.packing or d_batch.packing,
            long_documents=b.long_documents,
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
