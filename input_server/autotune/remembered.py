"""Tuning choices remembered across server restarts: one small JSON file per spec and host.

A restarted server (a trainer resuming after preemption, a rolling update) starts its "auto"
streams at once with the choice made before, instead of tuning again. A choice is kept under
a key of everything that decides it: the spec's data fingerprint and `workers` table (demand,
caps, time bound), the host's CPU count and the versions of what does the work. A file that
does not parse, or was written for another key, is ignored with a warning (and replaced at
the next tuning): the cost of a bad cache is one tuning, never a failed stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
import tempfile
from importlib import metadata
from typing import Any

from input_client.spec import PipelineSpec
from input_server.autotune.measurements import Tuning
from input_server.autotune.policy import cpu_count
from input_server.data.tokenizers import KINDS
from input_server.data.tokenizers.fast import version_of
from input_server.version import __version__

log = logging.getLogger(__name__)

FORMAT = 1


def default_folder() -> str:
    """`$XDG_CACHE_HOME/input-server/tune`, else `~/.cache/input-server/tune`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "input-server", "tune")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def _tokenizer_library(spec: PipelineSpec) -> str:
    """The kind and version of the library that tokenizes, and of the fast backends that may
    serve in its place (`tokenizer.backend`: a choice tuned for one is not the other's); none
    for pre-tokenized data."""
    t = spec.tokenizer
    if not t.model:
        return "none"
    kind = KINDS[t.kind]
    fast = [f"{n} {version_of(n)}" for n in kind.BACKENDS if t.backend in ("auto", n)]
    return f"{t.kind} {kind.library_version()}; backend {t.backend}: {', '.join(fast) or '-'}"


def key_fields(spec: PipelineSpec) -> dict[str, Any]:
    """What decides a tuning's choice, besides the measurements themselves."""
    workers = dataclasses.asdict(spec.workers)
    del workers["count"]  # "auto" by the time anything is remembered
    return {
        "format": FORMAT,
        "data": spec.data_fingerprint(),
        "workers": workers,
        "cpus": cpu_count(),
        "input_server": __version__,
        "grain": _version("grain"),
        "tokenizer": _tokenizer_library(spec),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }


class TuneCache:
    """Remembered choices in `folder` (created 0700; files 0600, written atomically)."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, fields: dict[str, Any]) -> str:
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]
        return os.path.join(self.folder, f"{digest}.json")

    def get(self, spec: PipelineSpec) -> Tuning | None:
        """The choice remembered for `spec` on this host, or None."""
        fields = key_fields(spec)
        path = self._path(fields)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("tune cache: ignoring %s, which cannot be read (%s)", path, e)
            return None
        try:
            if record["key"] != fields:
                raise ValueError("it was written for another spec, host or version")
            return Tuning.from_dict(record["tuning"])
        except (KeyError, TypeError, ValueError) as e:
            log.warning("tune cache: ignoring %s (%s)", path, e)
            return None

    def put(self, spec: PipelineSpec, tuning: Tuning) -> None:
        """Remembers `tuning` for `spec`; a failure to write is logged, never raised."""
        fields = key_fields(spec)
        path = self._path(fields)
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"key": fields, "tuning": tuning.to_dict()}, f, indent=1)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            log.warning(
                "tune cache: cannot write %s (%s); the choice is kept in memory only", path, e
            )
