"""The words of a tuning's reason that must agree with its table: the gains it measured.

Rows are `measurements.Measurement`s (anything with `batches_per_s` and a printable
`parallelism`); this module imports none of policy's names, which imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def plateau_words(
    c: Any,
    more: Sequence[Any],
    beyond: Sequence[Any],
    *,
    cpus: int,
    gains: tuple[float, float],
) -> str:
    """Why the workers beyond the choice `c` were not taken, with the gains the table shows
    (a bound alone, "at most 2 %", read wrong beside a row that was faster).

    Args:
      c: the chosen row.
      more: the rows that cost more than `c` among those the choice was made from.
      beyond: the rows with more workers than the cores that were left out (they did not
        gain `oversubscribe_gain`).
      gains: (choice_gain, oversubscribe_gain), policy's CHOICE_GAIN and OVERSUBSCRIBE_GAIN.
    """
    choice_gain, oversubscribe_gain = gains
    top = max(more, key=lambda m: m.batches_per_s, default=None)
    if top is None:
        words = "no more workers within the cores fit"
    elif top.batches_per_s <= c.batches_per_s:
        words = f"more workers were no faster (best of them {top.parallelism}: {_bps(top)})"
    else:
        words = (
            f"more workers gained {_gain(top, c)} ({top.parallelism}: {_bps(top)}), within the "
            f"{choice_gain:.0%} a choice's noise allows"
        )
    faster = max(beyond, key=lambda m: m.batches_per_s, default=None)
    if faster is not None and faster.batches_per_s > c.batches_per_s:
        words += (
            f"; more workers than the {cpus} cores gained {_gain(faster, c)} "
            f"({faster.parallelism}: {_bps(faster)}), under the {oversubscribe_gain:.0%} "
            f"oversubscribing them must gain"
        )
    return words


def _bps(m: Any) -> str:
    return f"{m.batches_per_s:.1f} batches/s"


def _gain(m: Any, base: Any) -> str:
    return f"{m.batches_per_s / base.batches_per_s - 1:.1%}"
