"""What lies outside the project, stood in for: remote storage's latency (a source whose
records arrive slowly) and a costly tokenizer (one that takes long over each document). Each
keeps the seconds it spent, on its own clock, for tests that check the server's accounting."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from input_client.spec import PipelineSpec
from input_server.batching.pipeline import Pipeline
from input_server.data.sources import DocumentSource
from input_server.data.tokenizers import TokenGroup


class Spent:
    """Seconds a stand-in spent, over every thread of this process (not its worker processes)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds = 0.0
        self.calls = 0

    def add(self, seconds: float, *, calls: int) -> None:
        with self._lock:
            self.seconds += seconds
            self.calls += calls

    def reset(self) -> None:
        with self._lock:
            self.seconds, self.calls = 0.0, 0

    def __reduce__(self):  # a worker process's copy starts its own count
        return (Spent, ())


class SlowSource:
    """Remote storage's latency: every record takes `delay_s` to arrive (sleeping, no CPU).
    Its `spent` is each whole read's time, as `SlowTokenizer`'s.

    Module-level, so it pickles into Grain's worker processes. Its `read_many` reads records
    one by one, as from a store that serves single objects.
    """

    def __init__(self, inner: DocumentSource, delay_s: float):
        self.inner = inner
        self.delay_s = delay_s
        self.spent = Spent()

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def components(self) -> list[tuple[int, int]]:
        return self.inner.components

    def release(self) -> None:
        self.inner.release()

    def close(self) -> None:
        self.inner.close()

    def __getitem__(self, index: int) -> str:
        started = time.perf_counter()
        time.sleep(self.delay_s)
        text = self.inner[index]
        self.spent.add(time.perf_counter() - started, calls=1)
        return text

    def read_many(self, indices: Sequence[int]) -> list[str]:
        return [self[i] for i in indices]

    def where(self, index: int) -> str:
        return self.inner.where(index)


class SlowTokenizer:
    """A costly tokenizer: the model's own, taking `delay_s` longer over each document (sleeping,
    no CPU). Module-level, so it pickles into Grain's worker processes. Its `spent` is each
    whole call's time, the model's own work in it: what a stage clock around the call should
    read, however slow a loaded host makes that work."""

    def __init__(self, inner, delay_s: float):
        self.inner = inner
        self.delay_s = delay_s
        self.spent = Spent()

    def encode(
        self, texts: list[str], first_doc: int = 0, trim_to: int | None = None
    ) -> TokenGroup:
        started = time.perf_counter()
        for _ in texts:
            time.sleep(self.delay_s)
        group = self.inner.encode(texts, first_doc, trim_to)
        self.spent.add(time.perf_counter() - started, calls=len(texts))
        return group

    @property
    def audit_share(self) -> float:  # written by the producer each batch: the model's own
        return self.inner.audit_share

    @audit_share.setter
    def audit_share(self, share: float) -> None:
        self.inner.audit_share = share

    def __getattr__(self, name: str):
        if name == "inner":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class SlowPipeline(Pipeline):
    """The spec's pipeline over its files as if they lay on remote storage (`SlowSource`,
    `delay_s` a record), its tokenizer taking `tokenize_delay_s` longer a document
    (`SlowTokenizer`) when that is set. What the stand-ins spent setting the pipeline up is
    forgotten: their `spent` is what its streams made them spend."""

    def __init__(self, spec: PipelineSpec, *, delay_s: float, tokenize_delay_s: float = 0.0):
        self.delay_s = delay_s
        super().__init__(spec)
        if tokenize_delay_s > 0:
            self.tokenizer = SlowTokenizer(self.tokenizer, tokenize_delay_s)
        self.source.spent.reset()

    def _open_source(self, spec: PipelineSpec) -> SlowSource:
        return SlowSource(DocumentSource.from_spec(spec.source, self.access), self.delay_s)
