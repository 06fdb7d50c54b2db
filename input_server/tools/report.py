"""How the benchmark and chaos scripts hand over their results: JSON on stdout, and in a file;
and the CLI's counted words."""

from __future__ import annotations

import json
from typing import Any


def emit_json(result: dict[str, Any], path: str | None = None) -> None:
    """Prints `result` as indented JSON, and writes the same text to `path` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 process`, `2 processes`: a count with its word."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"
