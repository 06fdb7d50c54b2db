"""A tuning's table and its choice: `Measurement` (one candidate's row) and `Tuning` (what
was chosen, why, and the rows behind it), with their JSON form (the tune cache's and
`input-server tune --json`'s)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from input_server.batching.parallelism import Parallelism


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement:
    """One candidate's measured production, or why it was skipped.

    Attributes:
      parallelism: the candidate.
      batches_per_s: packed batches per second after warm-up (0 when skipped).
      tokens_per_s: real (non-padding) tokens per second after warm-up.
      rss_mb: memory the candidate added, in MiB: its worker processes' RSS plus the server
        process's RSS growth while it ran; predicted from a smaller candidate when skipped.
      cpu_cores: CPU seconds per second of the server process and its worker processes.
      startup_s: seconds from opening the stream to its first batch.
      seconds: length of the timed window(s).
      batches: batches in the timed window(s).
      samples: timed windows pooled into the rates (2 after the second look).
      skipped: "" when run, else why not: "ram cap", "max workers" or "time limit".
    """

    parallelism: Parallelism
    batches_per_s: float = 0.0
    tokens_per_s: float = 0.0
    rss_mb: float = 0.0
    cpu_cores: float = 0.0
    startup_s: float = 0.0
    seconds: float = 0.0
    batches: int = 0
    samples: int = 1
    skipped: str = ""

    @property
    def rss_mb_per_worker(self) -> float:
        return self.rss_mb / self.parallelism.workers

    @property
    def ran(self) -> bool:
        return not self.skipped

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the parallelism's keys first, then the figures, then the derived
        `workers` and `rss_mb_per_worker` (the tune cache's and `tune --json`'s layout)."""
        return {
            **self.parallelism.to_dict(),
            **_figures(self),
            "workers": self.parallelism.workers,
            "rss_mb_per_worker": self.rss_mb_per_worker,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        """The inverse of `to_dict` (derived keys dropped)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"parallelism"}
        return cls(
            parallelism=Parallelism.from_dict(d), **{k: v for k, v in d.items() if k in names}
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tuning:
    """The autotuner's choice, why, and the measurements behind it.

    Attributes:
      parallelism: the choice.
      reason: one of `policy.REASONS`: "target met" (the fewest workers that meet the demand),
        "plateau" (more workers gained under `policy.PLATEAU_GAIN`), "ram cap", "max workers" or
        "time limit" (the cap or the time bound stopped a search still gaining), "fastest"
        (every candidate ran; the choice is the fastest).
      detail: the reason in a sentence, with the figures.
      measurements: every candidate in the order it ran (or was skipped).
      target_batches_per_s: the demand the choice had to meet (0 = unknown).
      ram_budget_mb: the memory budget the candidates were held to.
      max_workers: the cap on workers (0 = none).
      tune_seconds: seconds the tuning took.
    """

    parallelism: Parallelism
    reason: str
    detail: str
    measurements: tuple[Measurement, ...]
    target_batches_per_s: float = 0.0
    ram_budget_mb: float = math.inf
    max_workers: int = 0
    tune_seconds: float = 0.0

    @property
    def chosen(self) -> Measurement:
        """The measurement of the chosen candidate."""
        return next(m for m in self.measurements if m.ran and m.parallelism == self.parallelism)

    def summary(self) -> str:
        """One line for logs and `StreamInfo.worker_reason`."""
        p = self.parallelism
        return (
            f"{p.processes} process{'' if p.processes == 1 else 'es'} x {p.threads} "
            f"thread{'' if p.threads == 1 else 's'} ({self.reason}: "
            f"{self.detail}; {sum(m.ran for m in self.measurements)} candidates measured "
            f"in {self.tune_seconds:.1f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the tune cache's and `tune --json`'s layout)."""
        d = {**self.parallelism.to_dict(), **_figures(self)}
        d["measurements"] = [m.to_dict() for m in self.measurements]
        d["workers"] = self.parallelism.workers
        if math.isinf(self.ram_budget_mb):
            d["ram_budget_mb"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tuning:
        """The inverse of `to_dict` (derived fields dropped).

        Raises:
          TypeError, ValueError, KeyError: `d` is not a tuning's dict.
        """
        measurements = tuple(Measurement.from_dict(m) for m in d["measurements"])
        keep = {f.name for f in dataclasses.fields(cls)} - {"parallelism", "measurements"}
        values = {k: v for k, v in d.items() if k in keep}
        if values.get("ram_budget_mb") is None:
            values["ram_budget_mb"] = math.inf
        return cls(parallelism=Parallelism.from_dict(d), measurements=measurements, **values)


def _figures(x: Measurement | Tuning) -> dict[str, Any]:
    """The fields after `parallelism`, in their order (what `to_dict` writes after it)."""
    return {f.name: getattr(x, f.name) for f in dataclasses.fields(x) if f.name != "parallelism"}


def si_units(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"
