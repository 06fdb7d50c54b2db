"""`input-server info`: a running server's version, pipelines and streams, as a table for
people or (`--json`) as the `GetInfoResponse` proto's JSON for machines."""

from __future__ import annotations

import argparse
import json
import sys

from input_server.cli.arguments import positive
from input_server.cli.connection import Unreachable, add_connection_arguments, connected
from input_server.quoting import quote, quoted_copy

# Integer kinds that proto3's JSON mapping quotes ("16"); `--json` writes them as numbers.
_QUOTED_INTS = ("TYPE_INT64", "TYPE_UINT64", "TYPE_SINT64", "TYPE_FIXED64", "TYPE_SFIXED64")


def audit_words(s) -> str:
    """What the reference verified of a stream's (or the server's totals') fast-backend
    groups: "12 of 1,500 groups audited (0.8 %), 0 differed"."""
    share = s.audited_groups / s.backend_groups if s.backend_groups else 0.0
    return (
        f"{s.audited_groups:,} of {s.backend_groups:,} groups audited ({100 * share:.1f} %), "
        f"{s.audit_mismatches} differed"
    )


def _unquote_ints(message, d: dict) -> None:
    """Turns `d`'s (MessageToDict of `message`) quoted 64-bit integers back into ints."""
    for field in message.DESCRIPTOR.fields:
        key = field.json_name
        if key not in d:
            continue
        value = getattr(message, field.name)
        mt = field.message_type
        if mt is not None and mt.GetOptions().map_entry:
            vf = mt.fields_by_name["value"]
            for k, v in value.items():
                if vf.message_type is not None:
                    _unquote_ints(v, d[key][str(k)])
                elif _kind(vf) in _QUOTED_INTS:
                    d[key][str(k)] = int(v)
        elif mt is not None:
            if repeated(field):
                for m, sub in zip(value, d[key], strict=True):
                    _unquote_ints(m, sub)
            else:
                _unquote_ints(value, d[key])
        elif _kind(field) in _QUOTED_INTS:
            d[key] = [int(x) for x in value] if repeated(field) else int(value)


def _kind(field) -> str:
    return next(
        n for n, v in vars(type(field)).items() if n.startswith("TYPE_") and v == field.type
    )


def repeated(field) -> bool:
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def to_json(info) -> str:
    """The proto JSON of `info` with every field, zero ones too, and integers as numbers."""
    from google.protobuf import json_format

    d = json_format.MessageToDict(info, always_print_fields_with_no_presence=True)
    _unquote_ints(info, d)
    return json.dumps(d, indent=2)


def _rate(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _demand(s) -> str:
    """The loop's demand: measured, "≥" what it took when it took every batch made (a loop
    waiting for data wants at least that: demand_batches_per_s is 0 then), or "-" for a
    stream no tuner watches (a fixed `workers.count`)."""
    if not s.tuning_state:
        return "-"
    if s.demand_batches_per_s > 0:
        return _rate(s.demand_batches_per_s)
    return f"≥{_rate(s.consumed_batches_per_s)}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(info, address: str) -> str:
    """What a person reads: the server, the address used, each pipeline and each stream; every
    string quoted (a client's path or label, or what any server sends, starts no line)."""
    info, address = quoted_copy(info), quote(address)
    lines = [
        f"server     input-server {info.server_version} (wire protocol {info.protocol_version})",
        f"address    {address}",
    ]
    if not info.pipelines:
        lines.append("pipelines  none named (clients send their specs)")
    for i, (name, spec) in enumerate(sorted(info.pipelines.items())):
        sources = list(spec.mixture) or [spec.source]  # the proto's form
        all_paths = [p for s in sources for p in s.paths]
        paths = ", ".join(all_paths[:3]) + (" ..." if len(all_paths) > 3 else "")
        if spec.mixture:
            paths = f"a mixture of {len(sources)} sources ({paths})"
        model = spec.tokenizer.model or f"none (ids below {spec.tokenizer.vocab_size})"
        if spec.tokenizer.model and spec.tokenizer.kind:
            model += f" ({spec.tokenizer.kind})"
        lines.append(
            f"{'pipelines' if i == 0 else '':<10} {name}: {paths}; batch {spec.batch.size} x "
            f"{spec.batch.seq_len}, model {model}"
        )
    if not info.streams:
        lines.append("streams    none running")
        return "\n".join(lines)
    lines.append(f"streams    {len(info.streams)} running")
    head = (
        f"  {'id':>4}  {'pipeline':<32} {'processes':>9} {'threads':>7} {'tuning':<9} "
        f"{'produced':>8} {'sent':>6} {'taken':>6} {'taken/s':>8} {'demand/s':>8}"
    )
    lines.append(head)
    for s in info.streams:
        lines.append(
            f"  {s.stream_id:>4}  {_short(s.pipeline or '(spec)', 32):<32} {s.worker_processes:>9} "
            f"{s.worker_threads:>7} {s.tuning_state or '-':<9} {s.batches_produced:>8} "
            f"{s.batches_sent:>6} {s.batches_taken:>6} {_rate(s.consumed_batches_per_s):>8} "
            f"{_demand(s):>8}"
        )
        if s.worker_reason:
            lines.append(f"        why: {s.worker_reason}")
        if s.tokenizer_backend:
            audits = f"; {audit_words(s)}"
            failed = f"; the backend failed on {s.backend_failed_groups} groups (the reference's)"
            lines.append(
                f"        tokenized by {s.tokenizer_backend}: {s.tokenizer_backend_why}"
                + (audits if s.backend_groups else "")
                + (failed if s.backend_failed_groups else "")
            )
        for w in s.switches:
            lines.append(
                f"        at {w.at_s:.1f} s: {w.from_processes}x{w.from_threads} -> "
                f"{w.to_processes}x{w.to_threads} ({w.reason}; capacity "
                f"{_rate(w.capacity_batches_per_s)}, demand {_rate(w.demand_batches_per_s)} "
                f"batches/s)"
            )
    return "\n".join(lines)


def register(subparsers) -> None:
    info = subparsers.add_parser("info", help="print a running server's info")
    add_connection_arguments(info, positive=positive(float))
    info.add_argument("--json", action="store_true", help="the GetInfoResponse proto as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        with connected(args) as (client, address):
            info = client.info()
    except Unreachable as e:
        print(quote(e), file=sys.stderr)  # it may repeat what a server sent
        return 2
    print(to_json(info) if args.json else format_table(info, address))
    return 0
