"""The throughput benchmark behind `input-server bench`, and its one entry point, `bench`.

One run measures a spec's pipeline against its tokenizer's limit and a MaxText-style Grain
reference on the same corpus and cores (throughput.py), in rounds (rounds.py), in process and
through a real server process (served.py), after checking what it compares (preflight.py); it
says how long it will take (estimate.py) and prints a table (table.py; kinds.py for a row per
tokenizer kind). The benchmark scripts reuse its parts.
"""

from __future__ import annotations

import json
import sys

from input_client.spec import PipelineSpec

__all__ = ["bench"]


def bench(
    spec: PipelineSpec,
    *,
    kinds: tuple[str, ...] | None = None,
    min_tokens: int = 8_000_000,
    rounds: int | None = None,
    reference_processes: tuple[int, ...] | None = None,
    json_path: str | None = None,
) -> int:
    """Measures `spec` (a row per tokenizer kind with `kinds`), prints the table, writes the
    result as JSON to `json_path` if given; returns the exit status: 0, or 1 when a
    measurement failed (the other rows' figures printed and written all the same).

    Raises:
      SpecError, DataNotFoundError: a spec this cannot run, missing files or model, before
        anything is measured.
    """
    from input_server.batching.pipeline import Pipeline
    from input_server.benchmark import table, throughput
    from input_server.benchmark.rounds import failures

    Pipeline(spec)  # missing files or model, a spec that does not fit the data: one line
    options = dict(min_tokens=min_tokens, reference_processes=reference_processes)
    if kinds:
        from input_server.benchmark.kinds import format_kinds_table

        result = throughput.run_kinds(spec, kinds, rounds=rounds or 3, **options)
        print(format_kinds_table(result))
    else:
        result = throughput.run(spec, rounds=rounds or 5, **options)
        print(table.format_table(result))
    if json_path:
        with open(json_path, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    failed = failures(result)
    if failed:  # the other rows' figures are printed and written: exit 1, not a traceback
        print(
            f"input-server: bench: {len(failed)} measurement(s) failed ({'; '.join(failed)}); "
            f"the others' figures are above" + (f" and in {json_path}." if json_path else "."),
            file=sys.stderr,
        )
        return 1
    return 0
