"""A stream's parallelism: worker processes x threads, one value, ordered by what it costs.

Grain runs a stream's read-and-tokenize stage on `threads` in each of `processes` worker
processes, or in the server's own process when `processes` is 0. The policy, the offline and
online searches, the live tuner, the tune cache and the reports all speak of this one value.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Any

# Module-level alias so tests can pretend another host.
cpu_count = os.cpu_count


@dataclasses.dataclass(frozen=True, order=True)
class Parallelism:
    """How many document groups a stream reads and tokenizes at once, and where.

    Ordered by cost, the field order being the cost order: in-process threads before any
    worker process (no spawn, no copies, no per-process memory), then fewer processes, then
    fewer threads.

    Attributes:
      processes: worker processes; 0 = inside the server process.
      threads: threads per process, at least 1.
    """

    processes: int
    threads: int

    def __post_init__(self) -> None:
        for name, value, least in (("processes", self.processes, 0), ("threads", self.threads, 1)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"`{name}` must be an integer of at least {least}, got {value!r}.")
            object.__setattr__(self, name, int(value))  # a numpy integer serializes as an int

    @property
    def workers(self) -> int:
        """Document groups in flight at once: processes x threads (threads alone in process)."""
        return max(1, self.processes) * self.threads

    @property
    def in_process(self) -> bool:
        return self.processes == 0

    def __str__(self) -> str:
        where = f"{self.processes} proc" if self.processes else "in-proc"
        return f"{where} x {self.threads} thr"

    def to_dict(self) -> dict[str, int]:
        """The JSON form (the tune cache's and `input-server tune --json`'s keys)."""
        return {"processes": self.processes, "threads": self.threads}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Parallelism:
        """The inverse of `to_dict`; other keys are ignored.

        Raises:
          KeyError, ValueError: `d` holds no valid parallelism.
        """
        return cls(d["processes"], d["threads"])

    @classmethod
    def fixed(cls, processes: int, threads: int = 0) -> Parallelism:
        """What a fixed `workers.count` (and `workers.threads`, 0 = default) runs."""
        return cls(processes, threads or default_threads(processes))


def default_threads(processes: int) -> int:
    """Grain threads per process, each reading and tokenizing a group: one per core, since
    the tokenizers release the GIL while they encode; more only pay off to overlap slow reads,
    which the autotuner finds by measuring."""
    return max(1, min(8, (cpu_count() or 1) // max(1, processes)))
