"""The pod's view of the steps: every JAX process's data wait and step time, gathered across
processes a window at a time, the worst host of each step, and the pod's figures over them."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from input_client.running_sums import summed

# The TPU profiler's rule of thumb: a step is input-bound once its input wait is 5 % of the step,
# highly input-bound from 20 %.
INPUT_BOUND = 0.05
HIGHLY_INPUT_BOUND = 0.20

# Figures a process sends ahead of its window: its process index, the window's first step index
# and how many steps it holds (the rest is padding).
_HEADER = 3


@dataclasses.dataclass(frozen=True)
class PodStep:
    """One step as every process saw it.

    Attributes:
      index: the step's index (`StepRecord.index`, the same on every process).
      name: the step's name on this process.
      data_wait_s: each process's data wait for this step, by process index.
      step_s: each process's device time for this step, by process index.
    """

    index: int
    name: str
    data_wait_s: tuple[float, ...]
    step_s: tuple[float, ...]

    @property
    def worst_process(self) -> int:
        """The process that waited longest for this step's data (the lowest index on a tie)."""
        waits = self.data_wait_s
        return max(range(len(waits)), key=lambda p: (waits[p], -p))

    @property
    def worst_data_wait_s(self) -> float:
        """The longest data wait of any process: in lock step, what the pod waited."""
        return self.data_wait_s[self.worst_process]

    @property
    def worst_fraction(self) -> float | None:
        """The worst host's wait over its wait plus its step time (None when both are 0)."""
        p = self.worst_process
        busy = self.data_wait_s[p] + self.step_s[p]
        return self.data_wait_s[p] / busy if busy > 0 else None


def pod_summary(steps: Iterable[PodStep]) -> dict[str, Any]:
    """The pod's figures over `steps` (those a summary counts), by the worst host of each step.

    Args:
      steps: gathered steps.

    Returns:
      A dict: `pod_steps` (counted), `pod_worst_data_wait_s` (the worst hosts' waits summed),
      `pod_input_bound_fraction` (those waits over themselves plus the same hosts' step times),
      `pod_input_bound_steps` and `pod_highly_input_bound_steps` (the share of steps whose worst
      host waited more than 5 % and 20 % of its wait plus step), `pod_most_often_worst` (the
      process worst on most input-bound steps, as {"process", "steps"}; None when no step was
      input-bound). Shares and fractions are None without a step.
    """
    tally = PodTally()
    for s in steps:
        tally.add(s)
    return tally.figures()


@dataclasses.dataclass
class PodTally:
    """Running sums over gathered steps, by each step's worst host: all `pod_summary` needs of
    them, so a long run's timer keeps these (one a step name) instead of its steps.

    Attributes:
      steps: steps added.
      worst_data_wait_s: their worst hosts' data waits, summed.
      worst_step_s: the same hosts' own step times, summed.
      input_bound, highly_input_bound: the steps whose worst host waited more than
        `INPUT_BOUND` (`HIGHLY_INPUT_BOUND`) of its wait plus step.
      worst_of_bound: on the input-bound steps, how often each process was the worst.
    """

    steps: int = 0
    worst_data_wait_s: float = 0.0
    worst_step_s: float = 0.0
    input_bound: int = 0
    highly_input_bound: int = 0
    worst_of_bound: collections.Counter[int] = dataclasses.field(
        default_factory=collections.Counter
    )

    def add(self, s: PodStep) -> None:
        """Counts one more gathered step in."""
        worst = s.worst_process
        fraction = s.worst_fraction or 0.0
        self.steps += 1
        self.worst_data_wait_s += s.data_wait_s[worst]
        self.worst_step_s += s.step_s[worst]
        if fraction > INPUT_BOUND:
            self.input_bound += 1
            self.worst_of_bound[worst] += 1
        self.highly_input_bound += fraction > HIGHLY_INPUT_BOUND

    @classmethod
    def merged(cls, tallies: Iterable[PodTally]) -> PodTally:
        """One tally of the steps of several names."""
        return summed(cls, tallies)

    def figures(self) -> dict[str, Any]:
        """`pod_summary`'s figures over the steps added."""
        wait = self.worst_data_wait_s
        busy = wait + self.worst_step_s
        counts = self.worst_of_bound
        most = min(counts, key=lambda p: (-counts[p], p)) if counts else None

        def share(n: int) -> float | None:
            return n / self.steps if self.steps else None

        return {
            "pod_steps": self.steps,
            "pod_worst_data_wait_s": wait,
            "pod_input_bound_fraction": wait / busy if busy > 0 else None,
            "pod_input_bound_steps": share(self.input_bound),
            "pod_highly_input_bound_steps": share(self.highly_input_bound),
            "pod_most_often_worst": (
                {"process": most, "steps": counts[most]} if most is not None else None
            ),
        }


class PodGather:
    """One all-gather a window: each process's data waits and step times of `window` steps.

    The figures travel as the 32-bit words of float64 values (JAX without x64 would round a
    float64 to float32), so every process gets the others' figures bit for bit. The gather is
    dispatched and its result read later (`ready`, `collect`): on an accelerator the all-gather
    runs on the devices after the step that closed the window and the host does not wait for
    it; on CPU the dispatch itself returns when every process has joined.

    Every process must submit the same windows in the same order, as every process runs the
    same train steps: the gather is a collective.
    """

    def __init__(self, window: int):
        """Builds the mesh (a row a process) and compiles the gather, without running it.

        Args:
          window: steps per gather.

        Raises:
          ValueError: `window` is not positive.
        """
        import jax
        import numpy as np

        if window <= 0:
            raise ValueError(f"`window` must be positive, got {window}.")
        self.window = window
        self.processes = jax.process_count()
        self.process_index = jax.process_index()
        # Sorted so that row p of the gathered array is process p's.
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        mesh = jax.sharding.Mesh(
            np.array(devices).reshape(self.processes, -1), ("processes", "local")
        )
        self._rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("processes"))
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self._words = 2 * (_HEADER + 2 * window)
        shape = jax.ShapeDtypeStruct((self.processes, self._words), np.uint32, sharding=self._rows)
        # Compiled here, not at the first window: compiling takes a few hundred ms.
        self._gather = jax.jit(lambda x: x, out_shardings=replicated).lower(shape).compile()
        self._pending: Any = None

    def submit(self, first_index: int, data_wait_s: Sequence[float], step_s: Sequence[float]):
        """Dispatches the gather of one window (at most `window` steps; a shorter one is
        padded).

        Raises:
          RuntimeError: a window is still pending (`collect` it first).
        """
        import jax
        import numpy as np

        if self._pending is not None:
            raise RuntimeError("a gathered window is still pending: collect() it first.")
        count = len(data_wait_s)
        figures = np.zeros(_HEADER + 2 * self.window, np.float64)
        figures[:_HEADER] = (self.process_index, first_index, count)
        figures[_HEADER : _HEADER + count] = data_wait_s
        figures[_HEADER + self.window : _HEADER + self.window + count] = step_s
        local = figures.view(np.uint32)[None]
        rows = jax.make_array_from_process_local_data(
            self._rows, local, (self.processes, self._words)
        )
        self._pending = (first_index, count, self._gather(rows))

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def ready(self) -> bool:
        """Whether the pending window's result has arrived (False when none is pending)."""
        return self._pending is not None and self._pending[2].is_ready()

    def collect(self) -> list[tuple[int, tuple[float, ...], tuple[float, ...]]]:
        """The pending window's steps, waiting for them if need be: (index, each process's data
        wait, each process's step time) a step.

        Raises:
          RuntimeError: no window is pending, or the processes sent different windows (their
            timers are out of step: a process timed more or fewer steps).
        """
        import numpy as np

        if self._pending is None:
            raise RuntimeError("no gathered window is pending.")
        first, count, out = self._pending
        self._pending = None
        table = np.asarray(out.addressable_data(0)).view(np.float64)
        expected = np.array([[p, first, count] for p in range(self.processes)], np.float64)
        if not np.array_equal(table[:, :_HEADER], expected):
            seen = [tuple(int(v) for v in row) for row in table[:, :_HEADER]]
            raise RuntimeError(
                f"StepTimer's processes gathered different windows: expected steps {first} to "
                f"{first + count - 1} from every process, got (process, first step, steps) "
                f"{seen[:8]}; every process must time the same steps."
            )
        waits = table[:, _HEADER : _HEADER + count]
        steps = table[:, _HEADER + self.window : _HEADER + self.window + count]
        return [
            (first + i, tuple(waits[:, i].tolist()), tuple(steps[:, i].tolist()))
            for i in range(count)
        ]
