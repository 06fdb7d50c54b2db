"""Stand-ins for a stream's causes in the verdict tests (`input_server.testing.SlowPipeline`):
slow storage and a costly tokenizer, delays far above the real work they stand on."""

from __future__ import annotations

from input_server.batching.pipeline import MIN_GROUP
from input_server.testing import SlowPipeline

DELAY_S = 0.004  # a record's, or a document's tokenizing: far above the real work of either


def slow_pipeline(spec, *, read_s: float = 0.0, tokenize_s: float = 0.0) -> SlowPipeline:
    """`spec`'s pipeline with `read_s` seconds a record and `tokenize_s` a document, in short
    groups (`MIN_GROUP`) so that batches come steadily."""
    pipeline = SlowPipeline(spec, delay_s=read_s, tokenize_delay_s=tokenize_s)
    pipeline.group_size = MIN_GROUP  # short groups: batches come steadily
    return pipeline
