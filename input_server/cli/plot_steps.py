"""`input-server plot-steps FILE.jsonl -o OUT.png`: a training run's step time and data wait."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

# What every line needs: the fields `StepTimer` writes that the plot reads.
FIELDS = ("index", "step_s", "data_wait_s")


class RecordsError(ValueError):
    """The file is not a `StepTimer` records file."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot-steps",
        help="draw step time and data wait against the step from StepTimer records",
        description="Draws each step's device time and data wait (StepTimer(records_path=...) "
        "or timer.write_jsonl(...)) against the step, the first (compiling) step marked apart, "
        "so a stall in the input shows at a glance. Needs matplotlib.",
    )
    parser.add_argument("records", help="a JSON-lines file of StepTimer records")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--title", default="", help="the plot's title (default: the file's name)")


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


def read_records(path: str) -> list[dict[str, Any]]:
    """The records of a `StepTimer` JSON-lines file, in step order; blank lines skipped.

    Raises:
      RecordsError: a line that is not a record (names the line), or no record at all.
      OSError: the file cannot be read.
    """
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except ValueError as e:
                raise RecordsError(f"{where} is not JSON ({e})") from None
            if not isinstance(record, dict):
                raise RecordsError(f"{where} is not a JSON object: {line.strip()[:80]!r}")
            for key in FIELDS:
                _field(record, key, where)
            records.append(record)
    if not records:
        raise RecordsError(f"{path} holds no step records")
    return sorted(records, key=lambda r: r["index"])


def plot(records: list[dict[str, Any]], path: str, *, title: str) -> None:
    """Draws step time and data wait against the step into the PNG `path`; the first step
    (compilation, and the pipeline's start-up as its wait) is shaded apart and the scale is
    set by the others, so it does not flatten them.

    Raises:
      ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, rest = records[0], records[1:]
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    steps = [r["index"] for r in rest]
    ax.plot(steps, [r["step_s"] for r in rest], ".-", label="step (device) s")
    ax.plot(steps, [r["data_wait_s"] for r in rest], ".-", color="tab:red", label="data wait s")
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
    top = max([r["step_s"] for r in rest] + [r["data_wait_s"] for r in rest], default=0.0)
    ax.set_ylim(bottom=0, top=top * 1.25 or max(first["step_s"], first["data_wait_s"], 1.0))
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    def fail(message: object) -> int:
        print(f"input-server: {message}", file=sys.stderr)
        return 2

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return fail("plot-steps needs matplotlib: pip install matplotlib")
    try:
        records = read_records(args.records)
    except FileNotFoundError:
        return fail(f"no file {args.records!r}: give the file StepTimer(records_path=...) wrote")
    except (OSError, UnicodeDecodeError) as e:
        return fail(f"cannot read {args.records!r}: {e}")
    except RecordsError as e:
        return fail(f"{e}; plot-steps reads what StepTimer(records_path=...) writes")
    try:
        plot(records, args.output, title=args.title or args.records)
    except OSError as e:
        return fail(f"cannot write {args.output!r}: {e}")
    return 0
