"""Autotune: measures a pipeline at candidate parallelisms (processes x threads) and picks one.

`measurements` holds a tuning's table and its choice, `policy` decides on the table (pure),
`search` says what to measure next (pure), `measure` runs one candidate offline, `offline`
runs the offline search, `live` and `online` measure and steer a served stream, `openings`
gives each stream its starting parallelism and keeps the choices (`remembered`: across
restarts), `shared_cores` reads a live search's host-wide busy cores, `reasons` checks a
reason's words against its table, `report` renders a tuning (table, proto, plot).
"""

from input_server.autotune.measure import measure
from input_server.autotune.measurements import Measurement, Tuning
from input_server.autotune.offline import grain_choice, tune
from input_server.autotune.openings import Opening, Openings
from input_server.autotune.policy import (
    REASONS,
    TUNE_SECONDS,
    contenders,
    cpu_count,
    decide,
    pool,
)
from input_server.autotune.report import plot, table
from input_server.autotune.search import Candidate, next_candidate

__all__ = [
    "REASONS",
    "TUNE_SECONDS",
    "Candidate",
    "Measurement",
    "Opening",
    "Openings",
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
