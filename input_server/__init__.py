"""input-server: a gRPC server that runs Grain tokenize-pack-batch pipelines for JAX trainers.

The public face: `Server` and its `ServerConfig`, and `Pipeline` (a spec's batches in this
process). Each is imported on first use, so `import input_server` loads neither gRPC nor
Grain.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from input_server.version import __version__

__all__ = [
    "Pipeline",
    "Server",
    "ServerConfig",
    "__version__",
]

# Where each public name lives, imported when first asked for.
_HOMES = {
    "Pipeline": "input_server.batching.pipeline",
    "Server": "input_server.serving.server",
    "ServerConfig": "input_server.serving.config",
}

if TYPE_CHECKING:
    from input_server.batching.pipeline import Pipeline
    from input_server.serving.config import ServerConfig
    from input_server.serving.server import Server


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'input_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # asked once: the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
