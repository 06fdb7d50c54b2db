"""`input-server plot-steps FILE.jsonl -o OUT.png`: a training run's step time and data wait."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

# What every line needs: the fields `StepTimer` writes that the plot reads.
FIELDS = ("index", "step_s", "data_wait_s")

# More panels than this are too short to read; the rest are listed and drawn by `--run`.
MAX_PANELS = 6


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
        "listed. Needs matplotlib.",
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


def _check(record: Any, where: str, line: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise RecordsError(f"{where} is not a JSON object: {line.strip()[:80]!r}")
    for key in FIELDS:
        _field(record, key, where)
    if "wall_s" in record:  # absent from files written before StepTimer recorded it
        _field(record, "wall_s", where)
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


def _draw_run(ax, records: list[dict[str, Any]]) -> None:
    """One run's step time, data wait and step-to-step real time against the step; the first
    step (compilation, and the pipeline's start-up as its wait) is shaded apart and the scale
    is set by the others, so it does not flatten them."""
    first, rest = records[0], records[1:]
    steps = [r["index"] for r in rest]
    series = [[r["step_s"] for r in rest], [r["data_wait_s"] for r in rest]]
    ax.plot(steps, series[0], ".-", label="step (device) s")
    ax.plot(steps, series[1], ".-", color="tab:red", label="data wait s")
    if all("wall_s" in r for r in rest):
        # The loop's real time a step: above step + wait by what the loop does between steps.
        series.append([r["wall_s"] for r in rest])
        ax.plot(steps, series[2], ":", color="tab:gray", label="step to step (wall clock) s")
    ax.axvspan(first["index"] - 0.5, first["index"] + 0.5, color="gray", alpha=0.25)
    ax.text(
        first["index"],
        0.98,
        f" first step ({first.get('name', 'compile')}): "
        f"{first['step_s']:.3g} s + wait {first['data_wait_s']:.3g} s",
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


def plot(runs: list[Run], path: str, *, title: str) -> None:
    """Draws each run in its own panel, titled with its label, into the PNG `path`.

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
        ax.set_title(run.label)
    if len(runs) == 1 and runs[0].run_id is None:
        axes[0, 0].set_title(title)  # an older file of one run: nothing to tell apart
    else:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _listing(path: str, runs: list[Run], drawn: list[Run]) -> str:
    """What the file holds, a line a run, and which were drawn: how to pick one by `--run`."""
    lines = [f"{path}: {len(runs)} run{'s' * (len(runs) != 1)}"]
    for run in runs:
        where = (
            f"panel {drawn.index(run) + 1}" if run in drawn else f"not drawn: --run {run.number}"
        )
        lines.append(f"  {run.label}  {len(run.records)} steps  ({where})")
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
