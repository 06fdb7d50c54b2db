"""What `import jax` finds in a `serve` process and its worker processes: JAX is the
trainer's, and the server tokenizes and packs with numpy (`serving/warm.py`). Grain, whose
profiler tries JAX and logs through absl when it cannot, is told to keep that one warning to
itself here, in every process that imports this (a worker's stderr would carry it as plain
text beside the server's JSON lines)."""

import logging as _logging

_GRAIN_WITHOUT_JAX = "Failed to load jax profiler"


def _not_grains_warning(record: _logging.LogRecord) -> bool:
    return _GRAIN_WITHOUT_JAX not in str(record.msg)


def _quiet_grain() -> None:
    try:
        from absl import logging as absl_logging
    except ImportError:  # absl comes with Grain; without it nothing logs the warning
        return
    logger = absl_logging.get_absl_logger()
    if _not_grains_warning.__qualname__ not in {
        getattr(f, "__qualname__", "") for f in logger.filters
    }:
        logger.addFilter(_not_grains_warning)


_quiet_grain()
raise ImportError("JAX is kept out of input-server's `serve` processes (serving/warm.py)")
