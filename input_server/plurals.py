"""A count with its word, singular or plural, as the commands print them."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 process`, `2 processes`: a count with its word."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"
