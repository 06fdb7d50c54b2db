"""Helpers shared by the tests (and scripts/chaos.py): paths, pipelines run in process, batch
comparisons, server processes, fake servers."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
