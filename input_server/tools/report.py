"""The CLI's counted words (the scripts' JSON hand-over is scripts/report.py)."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 process`, `2 processes`: a count with its word."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"
