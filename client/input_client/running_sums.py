"""Tallies of running sums added together field by field (`StepTally`'s, `PodTally`'s)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TypeVar

Tally = TypeVar("Tally")


def summed(cls: type[Tally], tallies: Iterable[Tally]) -> Tally:
    """One tally of `tallies`, added field by field.

    Args:
      cls: the tallies' dataclass, every field of which is a running sum; `cls()` is an empty
        tally.
      tallies: tallies of `cls`.

    Returns:
      A new tally; `tallies` are left as they were.
    """
    out = cls()
    for t in tallies:
        for field in dataclasses.fields(cls):
            # Every field adds up, a `Counter` too: `Counter`'s `+` adds counts.
            setattr(out, field.name, getattr(out, field.name) + getattr(t, field.name))
    return out
