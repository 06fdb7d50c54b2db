"""A stream of synthetic documents through the server's own order, state, cursor and packers,
with no files: what elastic resume's property tests run many of (a real server per example
would take seconds). Record r of component c holds the ids `token(c, r, t)`, so each id in a
batch names the record and the token it came from."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator

import numpy as np

from input_client import PipelineSpec
from input_server.batching.pack import DocCursor, pack_batch
from input_server.batching.resharded import Resharded, run_fingerprint, settled
from input_server.batching.resume import Position, parse_state
from input_server.data.elastic import heads_of
from input_server.data.mixture import MixtureOrder, order_for
from input_server.data.tokenizers import TokenGroup

GROUP = 7  # documents a group: small, so documents with heads fall inside groups too
MAX_LEN = 100


def token(c: int, r: int, t: int) -> int:
    return 1 + (c * 1000 + r) * MAX_LEN + t


def record_of(tok: int) -> tuple[int, int, int]:
    """(component, record, token) of an id."""
    cr, t = divmod(tok - 1, MAX_LEN)
    return (*divmod(cr, 1000), t)


def spec_of(lengths, *, shard, packing, long_documents, seq_len, size, epochs, shuffle=True):
    """A pre-tokenized spec over len(lengths) components (one: a single source)."""
    sources = [
        {"paths": [f"c{c}.jsonl"], "token_field": "ids", "name": f"c{c}", "weight": c + 1}
        for c in range(len(lengths))
    ]
    one = {k: sources[0][k] for k in ("paths", "token_field")}
    return PipelineSpec(
        source=sources if len(lengths) > 1 else one,
        tokenizer={"vocab_size": 1 << 24, "add_bos": False, "add_eos": False},
        batch={
            "seq_len": seq_len,
            "size": size,
            "packing": packing,
            "long_documents": long_documents,
        },
        order={"seed": 7, "epochs": epochs, "shuffle": shuffle},
        shard={"index": shard[0], "count": shard[1]},
    )


class Stream:
    """The batches of `spec` over documents of `lengths[c][r]` tokens, from `state`."""

    def __init__(self, spec: PipelineSpec, lengths: list[list[int]], state=None):
        self.spec, self.lengths = spec, lengths
        starts = np.cumsum([0] + [len(x) for x in lengths])
        self.records = [(int(starts[c]), len(x)) for c, x in enumerate(lengths)]
        self.where = [(c, r) for c, x in enumerate(lengths) for r in range(len(x))]
        b = spec.batch
        self.rules = dict(
            splits_documents=b.packing == "concat_then_split",
            chunk_len=b.seq_len if b.long_documents_policy == "chunk" else 0,
        )
        plain = order_for(spec, self.records)
        self.fingerprint = spec.data_fingerprint(weights=not spec.all_named)
        self.pos = parse_state(
            state,
            fingerprint=self.fingerprint,
            num_docs=len(plain),
            mixture=plain if isinstance(plain, MixtureOrder) else None,
            resharded=Resharded(spec, self.records, None, **self.rules),
            **self.rules,
        )
        base = self.pos.order if self.pos.order is not None else plain
        if self.pos.mix is not None and self.pos.mix != base.at:
            base = base.moved(self.pos.mix)
        self.order = base
        self.cursor = DocCursor(
            self._groups(self.pos.doc // GROUP),
            self.pos.doc,
            self.pos.offset,
            long_documents=b.long_documents_policy,
            seq_len=b.seq_len,
            heads=heads_of(base),
        )
        self.seq = self.pos.seq
        self.state = state

    def _groups(self, g: int) -> Iterator[TokenGroup]:
        n = len(self.order)
        while g * GROUP < n:
            indices = self.order.source_indices(g * GROUP, (g + 1) * GROUP).tolist()
            docs = [self._tokens(*self.where[i]) for i in indices]
            lengths = np.asarray([len(d) for d in docs], np.int64)
            tokens = np.concatenate(docs) if docs else np.zeros(0, np.int32)
            yield TokenGroup(first_doc=g * GROUP, tokens=tokens, lengths=lengths)
            g += 1

    def _tokens(self, c: int, r: int) -> np.ndarray:
        return np.asarray([token(c, r, t) for t in range(self.lengths[c][r])], np.int32)

    def next(self) -> np.ndarray | None:
        """The next batch's real tokens (None at the end); `state` is the one after it."""
        b = self.spec.batch
        batch = pack_batch(self.cursor, size=b.size, seq_len=b.seq_len, packing=b.packing)
        if batch is None:
            return None
        self.seq += 1
        at = dataclasses.replace(self.position(), elastic=self.pos.elastic, order=self.pos.order)
        at = settled(at)  # as `Pipeline.state_of` writes it
        shard = (self.spec.shard.index, self.spec.shard.count)
        self.state = at.state(self.fingerprint, run=run_fingerprint(self.spec), shard=shard)
        tokens = batch.inputs.reshape(-1)
        return tokens[tokens > 0]

    def position(self) -> Position:
        return Position(self.seq, *self.cursor.at(), getattr(self.order, "at", None))


def components_at(order, pos) -> tuple[list[int], int, int]:
    """Each component's next document ordinal at `pos` of `order`, and the component and
    tokens used of the one the stream stands in (`MixtureOrder.next_ordinals`)."""
    if not hasattr(order, "next_ordinals"):
        return [pos.doc], 0, pos.offset
    nexts = order.next_ordinals(pos.doc)
    begun = int(order.locate(pos.doc, pos.doc + 1)[0][0]) if pos.offset else 0
    return nexts, begun, pos.offset


class Ledger:
    """What the rule says each record is read, counted without `data.elastic`: from where the
    old hosts stood (each component's next ordinal, plain shards: epoch = ordinal // its
    shard's documents an epoch) and where the new hosts stand, with their fresh shard orders.

    `want` maps (component, record) to the times it is read whole; `partial` lists the
    (component, record, tokens) read in part: the new hosts' current documents past the
    change's epochs.
    """

    def __init__(self, sizes: list[int], old_count: int):
        self.sizes, self.c = sizes, old_count
        self.olds = [[] for _ in sizes]  # per component: (next, head) of each old host
        self.partial: list[tuple[int, int, int]] = []
        self.phase_b = Counter()

    def old(self, nexts: list[int], begun: int, offset: int) -> None:
        for k, n in enumerate(nexts):
            self.olds[k].append((n, offset if k == begun else 0))

    def _per_epoch(self, k: int, i: int) -> int:
        return len(range(i, self.sizes[k], self.c))

    def last(self, k: int) -> int:
        """The last epoch of component k an old host began (-1: none)."""
        touched = [
            n // p if h else (n - 1) // p if n else -1
            for i, (n, h) in enumerate(self.olds[k])
            for p in [self._per_epoch(k, i)]
        ]
        return max(touched)

    def _share(self, k: int, epoch: int) -> int:
        """|R_e|: documents of `epoch` no old host had used (a partly used one counted)."""
        total = 0
        for i, (n, _) in enumerate(self.olds[k]):
            p = self._per_epoch(k, i)
            total += p - min(max(n - epoch * p, 0), p)
        return total

    def dealt(self, j: int, new_count: int) -> list[int]:
        """New host j's documents of the begun epochs, per component."""
        return [
            sum(len(range(j, self._share(k, e), new_count)) for e in range(self.last(k) + 1))
            for k in range(len(self.sizes))
        ]

    def new(self, fresh, j, new_count, nexts, begun, offset, *, plain=False) -> None:
        """New host j stands at `nexts` (past its dealt documents; `plain`: ordinals of its
        shard's own order, as a settled state gives them): the documents of its fresh shard
        order (`fresh`: its plain order, per component) it read past them."""
        dealt = self.dealt(j, new_count)
        for k, part in enumerate(getattr(fresh, "components", [fresh])):
            first = (self.last(k) + 1) * part.per_epoch
            whole = nexts[k] - (first if plain else dealt[k])
            assert whole >= 0, f"new host {j} stopped inside its dealt documents"
            records = part.source_indices(first, first + whole + 1).tolist()
            for r in records[:whole]:
                self.phase_b[k, r] += 1
            if k == begun and offset and len(records) > whole:
                self.partial.append((k, records[whole], offset))

    def whole(self) -> Counter:
        """(component, record) -> times read whole over old and new hosts."""
        out = Counter()
        for k, n in enumerate(self.sizes):
            for r in range(n):
                out[k, r] = self.last(k) + 1 + self.phase_b[k, r]
        return out
