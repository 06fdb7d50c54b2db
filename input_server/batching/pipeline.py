"""The pipeline: a spec's files, order and tokenizer opened; makes its groups and streams.

Grain warns that packing before its multiprocess prefetch makes the output depend on the worker
count, so only the per-document work (read + tokenize, in order-preserving groups: `groups`)
runs in parallel, and packing runs after it, in order, in the consuming process
(`batch_stream.BatchStream`, which `stream` opens). The resume state is the stream position
`(doc, offset)` after a batch, which no worker count changes.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Any

from input_client.spec import PipelineSpec
from input_server import cancel
from input_server.batching.batch_stream import BatchStream
from input_server.batching.encode import CachedIds, EncodeGroup
from input_server.batching.meter import LiveMeter
from input_server.batching.parallelism import Parallelism
from input_server.batching.resharded import Resharded, run_fingerprint, settled
from input_server.batching.resume import Position, parse_state
from input_server.data.ids import IdsOnly
from input_server.data.mixture import component_fingerprints, order_for
from input_server.data.order import Order
from input_server.data.roots import OPERATOR, DataAccess
from input_server.data.sources import DocumentSource
from input_server.data.tokenizers import Tokenizer, load_tokenizer
from input_server.data.tokenizers.base import AUDIT_EVERY

if TYPE_CHECKING:  # imported where groups are made: the server listens before Grain loads
    import grain

    from input_server.data.tokenizers.registry import FoundModel

# Text to tokenize per group (after long documents are cut, see groups.CUT_MARGIN_*): bigger
# calls amortize each group's fixed costs (groups of this size against groups of 64:
# docs/benchmarks.md, "Tokenizer side"). But a group's
# records are read one after another, so from slow (remote) storage a bigger group is a longer
# wait for each thread, and the autotuner's windows stretch past its time bound: 256 KiB. The
# documents per group follow from a sample of the corpus; the data never depends on it.
GROUP_CHARS = 256 << 10
GROUP_RAW_CHARS = 4 << 20
MIN_GROUP, MAX_GROUP = 8, 4096
SAMPLE_DOCS = 64
# The sample reads at most this much text in all, and learns characters per token from each
# document's first SAMPLE_DOC_CHARS: a 64 MB document tokenized whole would hold gigabytes.
SAMPLE_CHARS = 16 << 20
SAMPLE_DOC_CHARS = 64 << 10
MAX_NAMED_COMPONENTS = 64
log = logging.getLogger(__name__)


class Pipeline:
    """A validated spec with its files and tokenizer opened; makes batch streams from any state.

    Raises (from the constructor):
      InvalidSpecError: the spec does not fit the data (e.g. a shard that holds no document).
      DataNotFoundError: a file, glob or model is missing.
    """

    def __init__(
        self,
        spec: PipelineSpec,
        access: DataAccess = OPERATOR,
        *,
        audit_every: int = AUDIT_EVERY,
        token_cache=None,
        tokenizer_cache=None,
        load_behind: bool = False,  # a server's request streams: `Router.load_behind`
        model: FoundModel | None = None,  # its tokenizer's model, found (`find_model`)
    ):
        self.spec = spec  # valid: a PipelineSpec validates itself when built
        # Streams open on it (`stream_opened`); the last to close gives its files back.
        self._streams_open = 0
        self._streams_lock = threading.Lock()
        self.access = access
        # A named mixture's states are matched without its weights: under new weights each
        # component continues where it was (`resume.parse_state`).
        self.fingerprint = spec.data_fingerprint(weights=not spec.all_named)
        self.run = run_fingerprint(spec)  # the same on every host of a run
        # Each component's name and fingerprint ride in every state, for a refusal that names
        # what changed; past MAX_NAMED_COMPONENTS the states stay small and the refusal does not.
        named = spec.is_mixture and len(spec.sources) <= MAX_NAMED_COMPONENTS
        self.components = component_fingerprints(spec) if named else None
        self.tokenizer: Tokenizer  # a model's, or the ids-only one: one interface, no probes
        if spec.tokenizer.model:
            self.tokenizer = load_tokenizer(
                spec.tokenizer,
                access,
                found=model,
                keep=tokenizer_cache,
                audit_every=audit_every,
                load_behind=load_behind,
            )
        else:
            self.tokenizer = IdsOnly(spec.tokenizer)
        self.source = self._open_source(spec)
        try:
            self._set_up(spec)
        except BaseException:  # cancelled or refused: its files close now, not when collected
            self.close()
            raise
        self.cached, self.cache_use = CachedIds.of(token_cache, self)  # `serve --token-cache`
        # Set up: a stream opens again what it reads; until then the pipeline holds no
        # descriptor (a client may leave before its stream starts).
        self.release()

    def _set_up(self, spec: PipelineSpec) -> None:
        self.records = self.source.components
        self.order = order_for(spec, self.records, self.access.order_budget)
        self.docs_per_epoch = self.order.per_epoch
        self.specials = None
        if any(s.token_field for s in spec.sources):
            self.specials = self.tokenizer.specials()
        self.group_size = self._group_size()

    def release(self) -> None:
        """Closes its files' descriptors and maps now, keeping their decompressed text, so a
        later stream (a tuning's next candidate, a named pipeline's next client) reads it
        without decompressing again; they open again if read."""
        self.source.release()

    def close(self) -> None:
        """`release`, and drops what its files hold in memory (decompressed text, giving it
        back to --max-decompressed-mb; loaded columns): for when the pipeline is done (a
        request's, at the end of its stream: `serving/stream.py`). A named pipeline is never
        closed: its text stays, counted in the budget. A stream opened later reads again."""
        self.source.close()

    def stream_opened(self) -> None:
        """A stream on it opened (its `BatchStream`'s packer, each time one opens)."""
        with self._streams_lock:
            self._streams_open += 1

    def stream_closed(self) -> None:
        """A stream on it closed: the last to close `release`s its files at once."""
        with self._streams_lock:
            self._streams_open -= 1
            idle = self._streams_open == 0
        if idle:
            self.release()

    def _open_source(self, spec: PipelineSpec) -> DocumentSource:
        """The documents: a random-access source of strings that pickles for worker processes
        (`testing.SlowPipeline` stands remote storage's latency in here)."""
        return DocumentSource.from_spec(spec.source, self.access)  # a mixture's: each

    def trim_to(self) -> int | None:
        """Tokens the packer keeps of a document, if it keeps only a document's first ones
        (`batch.long_documents` trim, with every packing; chunk and split keep them all)."""
        b = self.spec.batch
        return b.seq_len if b.long_documents_policy == "trim" else None

    def _group_size(self) -> int:
        """Documents per group, so that a group is about GROUP_CHARS of text to tokenize,
        from a sample of the data (which also teaches the tokenizer its characters per token,
        used for cutting long documents before tokenizing). A document of ids counts two
        characters an id (what it holds, not tokenizing: it costs far less)."""
        sample, lengths, chars = [], [], []
        trim_to = self.trim_to()
        indices = (
            self.order.source_indices(0, SAMPLE_DOCS).tolist()
            if self.spec.is_mixture
            else range(min(SAMPLE_DOCS, len(self.source)))
        )
        is_text = []
        for i in indices:
            cancel.check()
            doc = self.source[i]
            is_text.append(isinstance(doc, str))
            if is_text[-1]:
                sample.append(doc[:SAMPLE_DOC_CHARS])
            lengths.append(len(doc) if is_text[-1] else 2 * len(doc))
            if sum(lengths) > SAMPLE_CHARS:
                break
        if sample:
            self.tokenizer.learn_chars_per_token(sample)
        self.tokenizer.choose_backend(sample)  # said in the stream_open log
        for n, text in zip(lengths, is_text, strict=True):
            chars.append(self.tokenizer.tokenized_chars(n, trim_to) if text else n)
        mean_chars = max(1, sum(chars) // max(1, len(chars)))
        # Cutting makes long documents cheap to tokenize, not to read or hold: a group's text
        # stays bounded too (a short seq_len would otherwise let MAX_GROUP long documents in).
        mean_raw = max(1, sum(lengths) // max(1, len(lengths)))
        size = min(GROUP_CHARS // mean_chars, GROUP_RAW_CHARS // mean_raw)
        return min(MAX_GROUP, max(MIN_GROUP, size))

    def encoder(self, order: Order | None = None) -> EncodeGroup:
        """What reads and tokenizes one group (`groups` maps it over the group numbers), over
        `order` (default the pipeline's; a resumed mixture's may stand elsewhere)."""
        return EncodeGroup(
            order or self.order,
            self.source,
            self.group_size,
            self.tokenizer,
            trim_to=self.trim_to(),
            specials=self.specials,
            cached=self.cached,
            budget=self.access.tokenizing_budget,
        )

    def groups(self, first_doc: int = 0, encode: EncodeGroup | None = None) -> grain.MapDataset:
        """Tokenized document groups from the one holding `first_doc` on (by `encode`)."""
        import grain

        size = self.group_size
        encode = encode or self.encoder()
        return grain.MapDataset.range(first_doc // size, math.ceil(len(encode.order) / size)).map(
            encode
        )

    def order_at(self, pos: Position) -> Order:
        """The order a stream from `pos` reads: a resharded state's own, a mixture's
        interleave where the state put it."""
        base = pos.order if pos.order is not None else self.order
        if pos.mix is None or pos.mix == base.at:
            return base
        return base.moved(pos.mix)

    def parse_state(self, state: bytes | dict[str, Any] | None) -> Position:
        """The position of a resume state sent back by a client (`resume.parse_state`)."""
        b = self.spec.batch
        rules = dict(
            splits_documents=b.packing == "concat_then_split",
            chunk_len=b.seq_len if b.long_documents_policy == "chunk" else 0,
        )
        budget = self.access.order_budget
        return parse_state(
            state,
            fingerprint=self.fingerprint,
            num_docs=len(self.order),
            mixture=self.order if self.order.at is not None else None,
            components=self.components,
            resharded=Resharded(self.spec, self.records, budget, **rules),
            **rules,
        )

    def state_of(self, pos: Position) -> dict[str, Any]:
        """The resume state a batch ending at `pos` carries."""
        shard = (self.spec.shard.index, self.spec.shard.count)
        pos = settled(pos)  # a resharded stream past what it was dealt: a plain state
        return pos.state(self.fingerprint, self.components, run=self.run, shard=shard)

    def stream(
        self,
        state: Position | bytes | dict[str, Any] | None = None,
        *,
        parallelism: Parallelism,
        meter: LiveMeter | None = None,
    ) -> BatchStream:
        """Batches from the start (state None or empty), or right after the batch whose state
        is given, with the parallelism the caller chose (for "auto", the server's `Openings`
        and then the stream's live tuning, which `BatchStream.switch`es it between batches);
        `meter` counts its groups' busy and waiting time (a new one if None)."""
        position = state if isinstance(state, Position) else self.parse_state(state)
        return BatchStream(self, position, parallelism, meter=meter)
