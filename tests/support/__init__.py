"""Helpers shared by the tests: a test module imports them from here (or from a submodule of
this package by its public name), never from another test module.

This face re-exports the helpers many tests use: paths, batch comparisons, processes, raw calls
to servers, another client's stream beside an attack, a CLI verb's mistakes, the client's
warnings, what pytest-xdist's workers share. What scripts/ share with the tests (child
processes, servers in a memory cgroup, pipelines run in process, documents in every file
format, the tiny MaxText decoder) lies in the installed `input_server.testing` package; the
names are re-exported here too.

The helpers of one subject are imported from their submodule, which this face does not load:
`elastic` (synthetic streams through the server's own order and packers), `deploy` (deploy/'s
manifests and Dockerfile read), `maxtext` (real MaxText runs), `mixture` (resharded states of a
16-component mixture), `figures` (what no server can report), `pages` (README and docs/ read),
`tokens` (documents' ids, text pieces to tokenize), `verdicts` (stand-ins for a stream's
causes), `metrics` (the Prometheus page), `proxy` (a recording proxy), `large_tokenizer` (a
large tokenizer.json in a memory cgroup), `progress` (a child's progress past pytest's
capture).

Imports of the heavy packages (Grain, grpc, pyarrow, ...) are lazy.
"""

from __future__ import annotations

from input_server.testing.files import (
    FORMATS,
    example_bytes,
    jsonl_bytes,
    write_arrayrecord,
    write_bytes,
    write_format,
    write_parquet,
    zst_multiframe,
)
from input_server.testing.maxtext import TINY_MAXTEXT
from input_server.testing.memory_bound import bounded_server, can_bound_memory, run_bounded
from input_server.testing.processes import (
    ChildProcess,
    ServerProcess,
    cli_argv,
    find_python,
    free_port,
    health,
    serve_servicer,
    write_token_file,
)
from input_server.testing.reference import batch_bytes, run_pipeline
from tests.support.batches import assert_same_batches, first_difference, same_batches, split3
from tests.support.calls import TOKENS, dial, raw_messages, stream_status
from tests.support.cli import assert_one_line, run_main
from tests.support.client_log import Said, client_warnings
from tests.support.flowing import (
    assert_peak_within,
    assert_still_flowing,
    flowing_stream,
    other_stream_spec,
)
from tests.support.parallel import file_lock, machine_share, run_dir
from tests.support.paths import ROOT, SCRIPTS, clean_copy, script
from tests.support.polling import consume_until, wait_for
from tests.support.processes import (
    needs_memory_cgroup,
    python_or_skip,
    serve_cli,
    serve_files,
    still_running,
    worker_processes,
)

__all__ = [
    "FORMATS",
    "ROOT",
    "SCRIPTS",
    "TINY_MAXTEXT",
    "TOKENS",
    "ChildProcess",
    "Said",
    "ServerProcess",
    "assert_one_line",
    "assert_peak_within",
    "assert_same_batches",
    "assert_still_flowing",
    "batch_bytes",
    "bounded_server",
    "can_bound_memory",
    "clean_copy",
    "cli_argv",
    "client_warnings",
    "consume_until",
    "dial",
    "example_bytes",
    "file_lock",
    "find_python",
    "first_difference",
    "flowing_stream",
    "free_port",
    "health",
    "jsonl_bytes",
    "machine_share",
    "needs_memory_cgroup",
    "other_stream_spec",
    "python_or_skip",
    "raw_messages",
    "run_bounded",
    "run_dir",
    "run_main",
    "run_pipeline",
    "same_batches",
    "script",
    "serve_cli",
    "serve_files",
    "serve_servicer",
    "split3",
    "still_running",
    "stream_status",
    "wait_for",
    "worker_processes",
    "write_token_file",
    "write_arrayrecord",
    "write_bytes",
    "write_format",
    "write_parquet",
    "zst_multiframe",
]
