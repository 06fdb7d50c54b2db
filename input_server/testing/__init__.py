"""Stand-ins and fixtures for tests and benchmarks: what lies outside the project (remote
storage's latency), corpora and tokenizer models written for tests (over the product's own
corpora and trainers in `data/`), child processes, files in every format, and hostile inputs.
Installed, so `scripts/` and `tests/` share them.

Each part is its own module, imported on use (a client-only process imports `processes`
without Grain); the two stand-ins of the old `input_server.testing` module stay here by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from input_server.testing.slow import SlowPipeline, SlowSource

__all__ = ["SlowPipeline", "SlowSource"]


def __getattr__(name: str) -> Any:
    # Lazily: the stand-ins import the pipeline (Grain), which the other modules here do not need.
    if name in __all__:
        from input_server.testing import slow

        return getattr(slow, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
