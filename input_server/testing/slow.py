"""Remote storage's latency, stood in for: a source whose records arrive slowly."""

from __future__ import annotations

import time

from input_client.spec import PipelineSpec
from input_server.batching.pipeline import Pipeline
from input_server.data.sources import DocumentSource


class SlowSource:
    """Remote storage's latency: every record takes `delay_s` to arrive (sleeping, no CPU).

    Module-level, so it pickles into Grain's worker processes. No `read_many`: records arrive
    one by one, as from a store that serves single objects.
    """

    def __init__(self, inner: DocumentSource, delay_s: float):
        self.inner = inner
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> str:
        time.sleep(self.delay_s)
        return self.inner[index]

    def where(self, index: int) -> str:
        return self.inner.where(index)


class SlowPipeline(Pipeline):
    """The spec's pipeline over its files as if they lay on remote storage (`SlowSource`)."""

    def __init__(self, spec: PipelineSpec, *, delay_s: float):
        self.delay_s = delay_s
        super().__init__(spec)

    def _open_source(self, spec: PipelineSpec) -> SlowSource:
        return SlowSource(DocumentSource.from_spec(spec.source, self.access), self.delay_s)
