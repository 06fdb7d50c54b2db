"""`input-server bench`'s table: a row per measurement (one skipped or failed says why in its
place), then the ratios and what was compared."""

from __future__ import annotations

from typing import Any

from input_server.benchmark.rounds import has_figures
from input_server.plurals import plural

NAME_WIDTH = 42


def _cpu(r: dict) -> str:
    if "server_cpu_ns_per_token" in r:
        return (
            f"{r['server_cpu_ns_per_token']:.0f} server + {r['client_cpu_ns_per_token']:.0f} client"
        )
    return f"{r['cpu_ns_per_token']:.0f}" if "cpu_ns_per_token" in r else ""


def _row(name: str, r: dict) -> str:
    if not has_figures(r):
        why = r.get("skipped") or r.get("failed")
        return f"{name:<{NAME_WIDTH}} {'skipped' if 'skipped' in r else 'failed'}: {why}"
    eff = r.get("packing_efficiency")
    line = (
        f"{name:<{NAME_WIDTH}} {r['tokens_per_s'] / 1e6:>10.2f} "
        f"{'' if eff is None else f'{eff:.3f}':>8}  {_cpu(r)}"
    )
    if "failed" in r:  # figures from the rounds before it failed
        line += f"  (then failed: {r['failed']})"
    return line


def audited(served: dict) -> str:
    """The share of a served run's fast-backend groups the reference verified, in words."""
    made, checked = served["backend_groups"], served["audited_groups"]
    return f"{checked:,} of {made:,} groups ({100 * checked / made:.1f} %)"


def format_table(result: dict[str, Any]) -> str:
    """The result of `throughput.run` as text."""
    kind = result.get("kind", "sentencepiece")
    rows = [(f"{kind} batch encode (limit)", result["limit"])]
    rows += [
        (f"MaxText-style reference, {plural(int(k), 'process', 'processes')}", v)
        for k, v in result["reference"].items()
    ]
    rows.append(("this pipeline, in process", result["pipeline_in_process"]))
    rows += [(f"through server + client, {k}", v) for k, v in result["server"].items()]
    lines = [f"{'what':<{NAME_WIDTH}} {'M tokens/s':>10} {'packing':>8}  CPU ns/token"]
    lines += [_row(name, r) for name, r in rows]
    ratios, per_round = result["ratios"], result.get("ratios_per_round", {})
    lines.append("")
    for k, v in ratios.items():
        line = f"{k:<{NAME_WIDTH}} " + (f"{v:>10.3f}" if isinstance(v, float) else f"{v:>10}")
        if k in per_round:  # the median of these
            line += "   rounds: " + " ".join(f"{x:.2f}" for x in per_round[k])
        lines.append(line)
    if "failed" in result.get("packing_same_order", {}):
        lines.append(f"packing comparison: failed: {result['packing_same_order']['failed']}")
    for t, r in result["server"].items():
        if has_figures(r):
            name = "wire bytes per token, " + t
            lines.append(f"{name:<{NAME_WIDTH}} {r['wire_bytes_per_token']:>10.2f}")
            if r.get("backend_groups"):
                lines.append(f"audited by the reference, {t}: {audited(r)}")
    b = result.get("tokenizer_backend")
    if b:
        lines.append(f"tokenizer backend: {b['backend']} ({b['why']})")
        lines.append(f"documents whose ids differ from the reference's: {b['documents_differing']}")
    if "call" in result["limit"]:
        lines.append(f"limit: {result['limit']['call']}")
    lines.append(f"reference encode: {result['reference_encode']}")
    return "\n".join(lines)
