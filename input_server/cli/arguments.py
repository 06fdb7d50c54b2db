"""Argument types the commands share."""

from __future__ import annotations

import argparse


def positive(kind):
    """A parser of `kind` (int, float) that refuses 0, negatives and infinity."""

    def parse(text: str):
        value = kind(text)
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
        return value

    return parse
