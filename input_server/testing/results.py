"""How the benchmark and chaos scripts hand over their results: JSON on stdout, and in a file."""

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
