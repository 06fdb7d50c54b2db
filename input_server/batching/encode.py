"""The parallel stage: one group of the ordered documents read and tokenized (texts by the
tokenizer's `encode` of the whole group, pre-tokenized ids checked and passed through), in
whichever worker thread or process Grain runs it."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import numpy as np

from input_server import stages
from input_server.data.ids import encode_documents
from input_server.data.order import DocumentOrder
from input_server.data.sources import DocumentSource
from input_server.data.token_cache_digest import FileState, SourceFiles, Unsettled, file_states
from input_server.data.tokenizers import Specials
from input_server.data.tokenizers.groups import group_of
from input_server.errors import CancelledError
from input_server.version import __version__

# The element keys of a group's wall time in its worker, and of its seconds in each worker
# stage (`stages.WORKER_STAGES`, in that order).
BUSY_KEY = "busy_s"
STAGES_KEY = "stage_s"


class InFlight:
    """The groups being computed in this process, and whether more may start. Grain's threads
    finish the groups they began after its iterator closes, so a closed stream stops new ones
    and waits for those before it closes its files (which they would open again, to stay
    open). Pickles as a new one: a worker process's groups end with the process."""

    def __init__(self):
        self._cond = threading.Condition()
        self._running = 0
        self._stopped = False

    def __reduce__(self):
        return (InFlight, ())

    def enter(self) -> None:
        with self._cond:
            if self._stopped:
                raise CancelledError("the stream closed; its groups are no longer read.")
            self._running += 1

    def exit(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def stop(self, timeout: float) -> bool:
        """Lets no group start; True once none runs (within `timeout` seconds)."""
        with self._cond:
            self._stopped = True
            return self._cond.wait_for(lambda: self._running == 0, timeout)


class CachedIds:
    """A pipeline's documents in the server's token cache (`serve --token-cache`): each
    document's ids as its group's encode gave them (trimmed as the pipeline trims), under a
    namespace that names everything they depend on (`_namespace`: the files' contents by
    digest), keyed by the document's index in the source. Served and kept only while every
    file still has the identity it was digested with (`token_cache_digest.SourceFiles`).
    Pickles with its cache (reopened in a worker)."""

    # Gets trust a check of the files this recent: a stat a file a second, not a group. A
    # stream's opening and every put check afresh (see `EncodeGroup` and `put`).
    CHECK_EVERY_S = 1.0

    def __init__(self, cache, namespace: str, files: SourceFiles):
        self.cache, self.namespace, self.files = cache, namespace, files

    @classmethod
    def of(cls, cache, pipeline) -> tuple[CachedIds | None, str]:
        """The pipeline's documents in `cache`, if it has one and its ids are the reference's
        own: text tokenized by the reference library. Not a fast backend's (reading ids back
        is no faster than it, and kept ids would escape its audit for good), nor ids read
        from the data (pre-tokenized: nothing to save). With what the stream's log says.
        Digests the files not digested before in their present state (`file_states`)."""
        if cache is None:
            return None, "off"
        if any(s.token_field for s in pipeline.spec.sources):
            return None, "not used: a source is pre-tokenized"
        if pipeline.tokenizer.choice.backend != "reference":
            return None, f"not used: {pipeline.tokenizer.choice.backend} tokenizes"
        try:
            states = file_states(cache, pipeline.source.files())
        except (Unsettled, OSError) as e:
            return None, f"not used: {e}"
        except CancelledError:  # raised by the request's next check, the pipeline built whole
            return None, "not used: cancelled while the files were digested"
        return cls(cache, _namespace(pipeline, states), SourceFiles(states)), "used"

    def current(self) -> bool:
        """Whether the files are still those digested (checked now): as a stream opens."""
        return self.files.unchanged()

    @staticmethod
    def _keys(indices: list[int]) -> list[bytes]:
        return [i.to_bytes(8, "little") for i in indices]

    def get(self, indices: list[int]) -> list[np.ndarray] | None:
        """Every document's ids, or None if any is missing (the group is read and tokenized
        whole: a partial hit would read the group's files anyway) or a file changed."""
        if not self.files.unchanged(self.CHECK_EVERY_S):
            return None
        found = self.cache.get_many(self.namespace, self._keys(indices))
        return None if any(x is None for x in found) else found

    def put(self, indices: list[int], group) -> None:
        # Checked after the group was read: unchanged now, its bytes were the digested ones.
        # Changed, they are not, and their ids must not be kept under that digest.
        if not self.files.unchanged():
            return
        ends = np.cumsum(group.lengths).tolist()
        starts = [e - n for e, n in zip(ends, group.lengths.tolist(), strict=True)]
        ids = [group.tokens[s:e] for s, e in zip(starts, ends, strict=True)]
        self.cache.put_many(self.namespace, self._keys(indices), ids)


def _namespace(pipeline, states: list[FileState]) -> str:
    """What a document's cached ids depend on besides its index in the source: each file's
    contents (its path, size and digest: `token_cache_digest`) with the fields and format
    read from it, the model (its digest), the flags, the reference library's version, this
    server's, and how far documents are kept. Any change and the ids are looked up elsewhere
    (and made again)."""
    t, tokenizer = pipeline.spec.tokenizer, pipeline.tokenizer
    digests = {s.path: s for s in states}
    files = []
    for path in pipeline.source.files():
        s = digests[path]
        files.append([path, s.identity[2], s.digest.hex()])
    fields = [
        [s.format, s.text_field, s.record_format, s.token_field] for s in pipeline.spec.sources
    ]
    blob = json.dumps(
        {
            "files": files,
            "fields": fields,
            "model": [tokenizer.digest(), t.kind, t.add_bos, t.add_eos],
            "library": tokenizer.library_version(),
            "server": __version__,
            "trim_to": pipeline.trim_to(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class EncodeGroup:
    """Reads and tokenizes documents `[g * size, (g + 1) * size)` of the ordered stream."""

    def __init__(
        self,
        order: DocumentOrder,
        source: DocumentSource,
        size: int,
        tokenizer,
        *,
        trim_to: int | None = None,
        specials: Specials | None = None,
        cached: CachedIds | None = None,
        budget: int | None = None,
    ):
        self.order = order  # a `DocumentOrder` or a `mixture.MixtureOrder`
        self.source = source
        self.size = size
        self.tokenizer = tokenizer
        # The vocabulary and specials pre-tokenized documents are checked against and given.
        self.specials = specials
        # Packings that keep only a document's first seq_len tokens need no more from it.
        self.trim_to = trim_to
        # Documents' ids kept from an earlier epoch or run; not if a file changed since the
        # pipeline digested it (checked now, as the stream opens: a later stream of a named
        # pipeline is not served ids of the bytes it had then).
        self.cached = cached if cached is not None and cached.current() else None
        self.in_flight = InFlight()
        # What the long documents tokenized at once in a process may take (the server's
        # --stream-memory-mb: `DataAccess.tokenizing_budget`); None: not counted.
        self.budget = budget

    def __call__(self, g: int) -> dict[str, np.ndarray]:
        self.in_flight.enter()
        try:
            return self._encode(g)
        finally:
            self.in_flight.exit()

    def _encode(self, g: int) -> dict[str, np.ndarray]:
        with stages.counting() as tally:
            started = time.perf_counter()
            first = g * self.size
            indices = self.order.source_indices(first, first + self.size).tolist()
            kept = self.cached.get(indices) if self.cached is not None else None
            if kept is not None:  # neither read nor tokenized: counted as reading
                element = group_of(kept, first, None).to_element()
                done = read = time.perf_counter()
            else:
                items = self.source.read_many(indices)
                read = time.perf_counter()
                # The tokenizer encodes on this thread and releases the GIL while its library
                # works (every kind; `data.tokenizers.Tokenizer.encode`), so Grain's threads
                # (and processes) are the tokenizing parallelism, which the autotuner sizes
                # (sentencepiece on one of its threads against two: docs/benchmarks.md,
                # "Tokenizer side").
                group = encode_documents(
                    self.tokenizer,
                    self.specials,
                    items,
                    first_doc=first,
                    trim_to=self.trim_to,
                    where=lambda i: self.source.where(indices[i]),
                    budget=self.budget,
                )
                element = group.to_element()
                if self.cached is not None:  # its time counted with tokenizing
                    self.cached.put(indices, group)
                done = time.perf_counter()
        # How long the group took in its worker: what a live stream's tuner measures the
        # parallel stage's utilization by (`autotune/live.py`); and where that time went.
        element[BUSY_KEY] = np.float64(done - started)
        tally["read"] += read - started - tally["decompress"]
        tally["tokenize"] += done - read
        element[STAGES_KEY] = np.fromiter(
            (tally[s] for s in stages.WORKER_STAGES), np.float64, len(stages.WORKER_STAGES)
        )
        return element
