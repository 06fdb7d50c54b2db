"""How long `input-server bench` will take, said before it starts."""

from __future__ import annotations

# What `estimate_s` assumes, from a 2-core host (a --rounds 1 run timed part by part): the
# MaxText-style reference and the packing comparison run at about 1/25 and 1/100 of
# sentencepiece's rate, this pipeline at 0.7 of it, and each served run pays ~12 s to start a
# server process and sample the wire.
REFERENCE_SHARE, PACKING_SHARE, PIPELINE_SHARE, SERVER_START_S = 1 / 25, 1 / 100, 0.7, 12.0


def estimate_s(
    *,
    limit_tokens_per_s: float,
    kept: int,
    epochs: int,
    rounds: int,
    min_seconds: float,
    cores: int,
) -> dict[str, float]:
    """Roughly how long `run` takes, by part, from sentencepiece's rate on this host."""
    r = max(limit_tokens_per_s, 1.0)
    run_s = kept * epochs / (PIPELINE_SHARE * r)
    parts = {
        "reference": len({0, 1, cores}) * (kept * max(1, epochs // 4) / (REFERENCE_SHARE * r) + 3),
        "round": min_seconds + run_s + 2 * (SERVER_START_S + run_s),
        "packing": kept / (PACKING_SHARE * r),
    }
    parts["total"] = parts["reference"] + rounds * parts["round"] + parts["packing"]
    return parts


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
