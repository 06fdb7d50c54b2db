"""Autotune: measures a pipeline at candidate processes x threads and picks the parallelism.

`policy` decides on a table of measurements (pure), `search` says what to measure next (pure),
`measure` runs one candidate offline, `tuner` runs the offline loop and owns the remembered
choices, `live` and `online` measure and steer a served stream, `report` renders a tuning
(table, proto, plot).
"""

from input_server.autotune.measure import measure
from input_server.autotune.policy import (
    REASONS,
    TUNE_SECONDS,
    Measurement,
    Tuning,
    contenders,
    cpu_count,
    decide,
    pool,
)
from input_server.autotune.report import plot, table
from input_server.autotune.search import Candidate, next_candidate
from input_server.autotune.tuner import Tuner, grain_choice, tune

__all__ = [
    "REASONS",
    "TUNE_SECONDS",
    "Candidate",
    "Measurement",
    "Tuner",
    "Tuning",
    "contenders",
    "cpu_count",
    "decide",
    "grain_choice",
    "measure",
    "next_candidate",
    "plot",
    "pool",
    "table",
    "tune",
]
