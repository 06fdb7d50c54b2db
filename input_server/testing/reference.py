"""A spec's stream with no server in between, and a batch's bytes: what a served stream, or a
trainer killed and resumed (scripts/tools/chaos.py), is compared with."""

from __future__ import annotations


def run_pipeline(
    spec_or_pipeline, state=None, *, processes: int = 0, threads: int = 2, limit: int | None = None
) -> list:
    """The stream with no server in between (`Produced` items): what a served stream must equal."""
    from itertools import islice

    from input_server.batching.parallelism import Parallelism
    from input_server.batching.pipeline import Pipeline

    pipeline = (
        spec_or_pipeline if isinstance(spec_or_pipeline, Pipeline) else Pipeline(spec_or_pipeline)
    )
    with pipeline.stream(state, parallelism=Parallelism(processes, threads)) as stream:
        return list(islice(stream, limit))


def batch_bytes(batch) -> bytes:
    """A batch's arrays in name order as bytes: what chaos.py's trainer logs and compares."""
    import numpy as np

    return b"".join(np.ascontiguousarray(np.asarray(batch[k])).tobytes() for k in sorted(batch))
