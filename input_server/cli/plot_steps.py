"""`input-server plot-steps FILE.jsonl -o OUT.png`: a training run's step time and data wait
(on a pod, the worst host's beside this one's)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import textwrap
from typing import Any

from input_client.pod import HIGHLY_INPUT_BOUND, INPUT_BOUND
from input_server.plurals import plural

# What every line needs: the fields `StepTimer` writes that the plot reads.
FIELDS = ("index", "step_s", "data_wait_s")

# What a line of a multi-process run carries beside them (StepTimer's pod view): all or none.
POD_FIELDS = ("process", "worst_process", "worst_data_wait_s", "worst_step_s")

# More panels than this are too short to read; the rest are listed and drawn by `--run`.
MAX_PANELS = 6

# Characters a title line may hold: what a panel's width fits at the title's font size, with
# room for wide characters (a run id's capitals and digits); longer lines are wrapped, which a
# pod run's title (its run and the worst host beside it) needed, cut off at the right before.
TITLE_CHARS = 72


class RecordsError(ValueError):
    """The file is not a `StepTimer` records file."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One `StepTimer`'s lines of a records file.

    Attributes:
      number: its place in the file, 1 for the first run (what `--run N` names).
      run_id: the lines' `run`; None for lines written before runs were named, which are told
        apart where the step index starts again (a new timer counts from 0).
      records: its lines, in step order.
    """

    number: int
    run_id: str | None
    records: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return f"run {self.number}: {self.run_id}" if self.run_id else f"run {self.number} (no id)"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot-steps",
        help="draw step time and data wait against the step from StepTimer records",
        description="Draws each step's device time, data wait and real time from the previous "
        "step (StepTimer(records_path=...) or timer.write_jsonl(...)) against the step, the "
        "first (compiling) step marked apart, so a stall in the input shows at a glance. Runs "
        f"appended to one file are drawn apart, one panel each (the last {MAX_PANELS}), and "
        "listed. A run of several JAX processes also draws the worst host's data wait each "
        "step, marks the steps another host was worst, shades those where it was input-bound "
        "(over 5 % and 20 % of its wait plus step) and names the process and the host most "
        "often worst. Needs matplotlib.",
    )
    parser.add_argument("records", help="a JSON-lines file of StepTimer records")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--title", default="", help="the plot's title (default: the file's name)")
    parser.add_argument(
        "--run",
        metavar="RUN",
        help="draw only this run: its id (StepTimer's run_id) or its number in the listing "
        "(1 the first, -1 the last)",
    )


def _field(record: dict[str, Any], key: str, where: str) -> float:
    value = record.get(key)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise RecordsError(f"{where}: `{key}` must be a number >= 0, got {value!r}")
    return value


def _check_pod(record: dict[str, Any], where: str) -> None:
    """A pod line's fields: all four or none, the processes indices, the worst host's figures
    seconds."""
    present = [k for k in POD_FIELDS if k in record]
    if not present:
        return
    if len(present) < len(POD_FIELDS):
        missing = ", ".join(f"`{k}`" for k in POD_FIELDS if k not in record)
        raise RecordsError(f"{where}: a pod line without {missing}")
    for key in ("process", "worst_process"):
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RecordsError(f"{where}: `{key}` must be a process index >= 0, got {value!r}")
    _field(record, "worst_data_wait_s", where)
    _field(record, "worst_step_s", where)


def _check(record: Any, where: str, line: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise RecordsError(f"{where} is not a JSON object: {line.strip()[:80]!r}")
    for key in FIELDS:
        _field(record, key, where)
    if "wall_s" in record:  # absent from files written before StepTimer recorded it
        _field(record, "wall_s", where)
    _check_pod(record, where)
    run = record.get("run")
    if "run" in record and (not isinstance(run, str) or not run):
        raise RecordsError(f"{where}: `run` must be a non-empty string, got {run!r}")
    return record


def read_runs(path: str) -> list[Run]:
    """The runs of a `StepTimer` JSON-lines file, in the order each first appears; blank lines
    skipped. Lines without a `run` (older files) make a new run where the index does not grow.

    Raises:
      RecordsError: a line that is not a record (names the line), or no record at all.
      OSError: the file cannot be read.
    """
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    unnamed = 0  # runs of lines without an id so far
    previous: dict[str, Any] | None = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                parsed = json.loads(line)
            except ValueError as e:
                raise RecordsError(f"{where} is not JSON ({e})") from None
            record = _check(parsed, where, line)
            if "run" in record:
                key: tuple[str, Any] = ("id", record["run"])
            else:
                if previous is None or "run" in previous or record["index"] <= previous["index"]:
                    unnamed += 1
                key = ("unnamed", unnamed)
            groups.setdefault(key, []).append(record)
            previous = record
    if not groups:
        raise RecordsError(f"{path} holds no step records")
    return [
        Run(
            number=n,
            run_id=key[1] if key[0] == "id" else None,
            records=sorted(records, key=lambda r: r["index"]),
        )
        for n, (key, records) in enumerate(groups.items(), 1)
    ]


def choose(runs: list[Run], wanted: str | None) -> list[Run]:
    """The runs to draw: the one `wanted` names (an id first, else a number), or the last
    `MAX_PANELS`.

    Raises:
      RecordsError: `wanted` names no run in the file (the message lists them).
    """
    if wanted is None:
        return runs[-MAX_PANELS:]
    for run in runs:
        if run.run_id == wanted:
            return [run]
    try:
        n = int(wanted)
    except ValueError:
        n = 0
    if 1 <= n <= len(runs):
        return [runs[n - 1]]
    if -len(runs) <= n <= -1:
        return [runs[n]]
    shown = ", ".join(run.label for run in runs[-10:])
    more = f" (and {len(runs) - 10} earlier)" if len(runs) > 10 else ""
    raise RecordsError(
        f"no run {wanted!r}: --run takes a run's id or its number; the file's runs are "
        f"{shown}{more}"
    )


def worst_fraction(record: dict[str, Any]) -> float:
    """A pod line's worst host's wait over its wait plus its own step time (0 when both are
    0): the share `StepTimer`'s pod summary holds against 5 % and 20 %."""
    busy = record["worst_data_wait_s"] + record["worst_step_s"]
    return record["worst_data_wait_s"] / busy if busy > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class PodView:
    """What a run's pod lines (`StepTimer` on several processes) say, over its steps after the
    first.

    Attributes:
      process: the index of the process that wrote the file.
      steps: the steps with the pod's figures.
      input_bound: of those, the steps whose worst host waited over 5 % of its wait plus step.
      worst: the process worst most often on the input-bound steps (the summary's
        `pod_most_often_worst`), or on all the steps when none was; the lowest on a tie.
      worst_steps: on how many of those it was worst.
    """

    process: int
    steps: int
    input_bound: int
    worst: int | None
    worst_steps: int

    @classmethod
    def of(cls, records: list[dict[str, Any]]) -> PodView | None:
        """The view of a run's records; None for a run without pod lines (one process)."""
        pod = [r for r in records if "worst_process" in r]
        if not pod:
            return None
        rest = [r for r in records[1:] if "worst_process" in r]
        bound = [r for r in rest if worst_fraction(r) > INPUT_BOUND]
        counts: dict[int, int] = {}
        for r in bound or rest:
            counts[r["worst_process"]] = counts.get(r["worst_process"], 0) + 1
        worst = min(counts, key=lambda p: (-counts[p], p)) if counts else None
        return cls(
            process=pod[0]["process"],
            steps=len(rest),
            input_bound=len(bound),
            worst=worst,
            worst_steps=counts.get(worst, 0) if worst is not None else 0,
        )

    @property
    def label(self) -> str:
        """ "process 0; worst host process 2 (7 of 9 input-bound steps)"."""
        if self.worst is None:
            return f"process {self.process}"
        if self.input_bound:
            of = f"{self.worst_steps} of {self.input_bound} input-bound steps"
        else:
            of = f"{self.worst_steps} of {self.steps} steps, none input-bound"
        return f"process {self.process}; worst host process {self.worst} ({of})"


def _spans(steps: list[int]) -> list[tuple[int, int]]:
    """Consecutive step indices as (first, last) spans: one shaded band each, not a band a
    step."""
    spans: list[tuple[int, int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], step)
        else:
            spans.append((step, step))
    return spans


def _draw_pod(ax, rest: list[dict[str, Any]]) -> list[float]:
    """The worst host's data wait beside this process's, a mark where another host was the
    worst, and bands where the worst host was input-bound (over 5 % of its wait plus step) and
    highly so (20 %), the TPU profiler's thresholds; returns the worst waits drawn."""
    pod = [r for r in rest if "worst_process" in r]
    worst = [r["worst_data_wait_s"] for r in pod]
    if not pod:
        return worst
    ax.plot(
        [r["index"] for r in pod],
        worst,
        "--",
        color="tab:purple",
        label="worst host's data wait s",
    )
    other = [r for r in pod if r["worst_process"] != r["process"]]
    if other:
        ax.plot(
            [r["index"] for r in other],
            [r["worst_data_wait_s"] for r in other],
            "v",
            linestyle="none",
            color="tab:purple",
            label="another host was worst",
        )
    bands = (
        (INPUT_BOUND, "tab:orange", "input-bound", "input-bound"),
        (HIGHLY_INPUT_BOUND, "tab:red", "highly-input-bound", "highly input-bound"),
    )
    for limit, color, gid, words in bands:
        spans = _spans([r["index"] for r in pod if worst_fraction(r) > limit])
        for n, (first, last) in enumerate(spans):
            ax.axvspan(
                first - 0.5,
                last + 0.5,
                color=color,
                alpha=0.12,
                gid=gid,  # what a reader of the figure (a test) finds the band by
                label=f"worst host {words} (> {100 * limit:.0f} %)" if n == 0 else "_nolegend_",
            )
    return worst


def _draw_run(ax, records: list[dict[str, Any]]) -> None:
    """One run's step time, data wait and step-to-step real time against the step (on a pod,
    the worst host's wait too: `_draw_pod`); the first step (compilation, and the pipeline's
    start-up as its wait) is shaded apart and the scale is set by the others, so it does not
    flatten them."""
    first, rest = records[0], records[1:]
    steps = [r["index"] for r in rest]
    series = [[r["step_s"] for r in rest], [r["data_wait_s"] for r in rest]]
    ax.plot(steps, series[0], ".-", label="step (device) s")
    ax.plot(steps, series[1], ".-", color="tab:red", label="data wait s")
    if all("wall_s" in r for r in rest):
        # The loop's real time a step: above step + wait by what the loop does between steps.
        series.append([r["wall_s"] for r in rest])
        ax.plot(steps, series[2], ":", color="tab:gray", label="step to step (wall clock) s")
    series.append(_draw_pod(ax, rest))
    ax.axvspan(first["index"] - 0.5, first["index"] + 0.5, color="gray", alpha=0.25)
    # On a line of its own: beside the step's figures it ran under the legend.
    worst = (
        f"\n the worst host's wait: process {first['worst_process']}, "
        f"{first['worst_data_wait_s']:.3g} s"
        if "worst_process" in first
        else ""
    )
    ax.text(
        first["index"],
        0.98,
        f" first step ({first.get('name', 'compile')}): "
        f"{first['step_s']:.3g} s + wait {first['data_wait_s']:.3g} s{worst}",
        transform=ax.get_xaxis_transform(),  # x in steps, y at the top of the axes
        va="top",
        fontsize=8,
    )
    top = max((v for values in series for v in values), default=0.0)
    ax.set_ylim(bottom=0, top=top * 1.25 or max(first["step_s"], first["data_wait_s"], 1.0))
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")


def _title(*parts: str) -> str:
    """A title of `parts`, each on lines of at most `TITLE_CHARS` (a long one broken at its
    spaces, or anywhere if it has none, as a file's path)."""
    return "\n".join(line for part in parts for line in textwrap.wrap(part, TITLE_CHARS))


def plot(runs: list[Run], path: str, *, title: str) -> None:
    """Draws each run in its own panel, titled with its label (on a pod, the worst host on a
    line of its own), into the PNG `path`.

    Raises:
      ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A panel per run: drawn on one axis, runs' steps (each counted from 0) fall on each other.
    fig, axes = plt.subplots(len(runs), 1, figsize=(8.0, 4.0 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        _draw_run(ax, run.records)
        pod = PodView.of(run.records)
        ax.set_title(_title(run.label) if pod is None else _title(run.label, pod.label))
    if len(runs) == 1 and runs[0].run_id is None and PodView.of(runs[0].records) is None:
        axes[0, 0].set_title(_title(title))  # an older file of one run: nothing to tell apart
    else:
        fig.suptitle(_title(title))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _listing(path: str, runs: list[Run], drawn: list[Run]) -> str:
    """What the file holds, a line a run, and which were drawn: how to pick one by `--run`."""
    lines = [f"{path}: {plural(len(runs), 'run')}"]
    for run in runs:
        where = (
            f"panel {drawn.index(run) + 1}" if run in drawn else f"not drawn: --run {run.number}"
        )
        pod = PodView.of(run.records)
        also = "" if pod is None else f"; {pod.label}"
        lines.append(f"  {run.label}  {plural(len(run.records), 'step')}  ({where}){also}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    def fail(message: object) -> int:
        print(f"input-server: {message}", file=sys.stderr)
        return 2

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return fail("plot-steps needs matplotlib: pip install matplotlib")
    try:
        runs = read_runs(args.records)
        drawn = choose(runs, args.run)
    except FileNotFoundError:
        return fail(f"no file {args.records!r}: give the file StepTimer(records_path=...) wrote")
    except (OSError, UnicodeDecodeError) as e:
        return fail(f"cannot read {args.records!r}: {e}")
    except RecordsError as e:
        return fail(f"{e}; plot-steps reads what StepTimer(records_path=...) writes")
    try:
        plot(drawn, args.output, title=args.title or args.records)
    except OSError as e:
        return fail(f"cannot write {args.output!r}: {e}")
    print(_listing(args.records, runs, drawn))
    return 0
