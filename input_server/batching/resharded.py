"""Reads a resharded state (`input_client.reshard`) into the order its stream reads.

A resharded state holds `elastic`: `deal` [k, n] (this stream's share of the old streams'
unused documents) and `from`, every old stream's state as that stream's server wrote it (or
just its `shard`, for one that took no batch). Each old state is read as a resume state of its
own shard (its fingerprint checked against this spec under that shard), and may itself be a
resharded one; their positions become each component's old streams (`data.elastic.Old`).

What a state may make the server do is bounded before it is done (old streams in all, old
streams times components, nesting, epochs spanned), and the reading itself runs under the
server's set-up gate (`batching.pacing`): free for a short grace, then paced at a share of
one core, one request at a time, within a CPU budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from input_client.elastic import MAX_STREAMS
from input_client.spec import PipelineSpec, ShardSpec
from input_server.batching.pacing import GATE
from input_server.batching.resume import Position, parse_state
from input_server.data.elastic import Old, ReshardedOrder
from input_server.data.mixture import order_for
from input_server.data.order import DocumentOrder, Order, OrderBudget
from input_server.errors import InvalidSpecError

# How deep resharded states may nest (`input_client.elastic.MAX_STREAMS` bounds how many old
# streams they name in all); old streams times mixture components, the orders a state makes
# the server build before its budget is checked (2^16: 4096 old streams of a 16-component
# mixture took 1.7 s of CPU here, 0.3 s once made from the new stream's order); the most
# shards an old stream may name (the spec's own bound: `shard.count` is an int32).
MAX_DEPTH = 8
MAX_ORDERS = 1 << 16
MAX_SHARDS = (1 << 31) - 1


def run_fingerprint(spec: PipelineSpec) -> str:
    """The data fingerprint of `spec` on any shard: what a run's hosts' states share."""
    return spec.data_fingerprint(weights=not spec.all_named, shard=ShardSpec())


class ShardFingerprints:
    """`spec.data_fingerprint(weights=not spec.all_named, shard=s)` for many shards `s`: the
    spec serialized once and each shard's table put in its place (4,096 old states of a
    16-component mixture took 1.6 s of CPU through `data_fingerprint`, which serializes the
    whole spec each time). Checked against `data_fingerprint` on two shards first: should its
    form ever change, every shard's is computed that way."""

    _MARK = "\0shard\0"

    def __init__(self, spec: PipelineSpec):
        self.spec, self.weights = spec, not spec.all_named
        tables = spec.to_dict(weights=self.weights)
        del tables["workers"]
        tables["tokenizer"].pop("backend", None)
        tables["shard"] = self._MARK
        self._head, _, self._tail = json.dumps(tables, sort_keys=True).partition(
            json.dumps(self._MARK)
        )
        self._fast = all(
            self._joined(s) == spec.data_fingerprint(weights=self.weights, shard=s)
            for s in (ShardSpec(), ShardSpec(index=1, count=3))
        )

    def _joined(self, shard: ShardSpec) -> str:
        table = json.dumps(dataclasses.asdict(shard), sort_keys=True)
        blob = (self._head + table + self._tail).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __call__(self, shard: ShardSpec) -> str:
        if self._fast:
            return self._joined(shard)
        return self.spec.data_fingerprint(weights=self.weights, shard=shard)


class Resharded:
    """Reads resharded states of `spec` over a source whose component c is the records
    `components[c]` (start, count); `budget` bounds all the orders one holds.

    Args:
      spec: the stream's spec (its shard is the new stream's).
      components: as `mixture.order_for` takes them.
      budget: the stream's order budget (None: unbounded, for tests).
      splits_documents, chunk_len: as `resume.parse_state` takes them.
    """

    def __init__(
        self,
        spec: PipelineSpec,
        components: Sequence[tuple[int, int]],
        budget: OrderBudget | None,
        *,
        splits_documents: bool,
        chunk_len: int,
    ):
        self.spec, self.components, self.budget = spec, list(components), budget
        self.run = run_fingerprint(spec)
        self._rules = dict(splits_documents=splits_documents, chunk_len=chunk_len)
        self._streams = 0
        self._pace: Callable[[], None] = lambda: None

    def __call__(self, d: dict[str, Any]) -> Order:
        """The order of the resharded state `d` (a stream of this spec's shard)."""
        self._streams = 0
        self._fingerprint = ShardFingerprints(self.spec)  # here: most streams resume no reshard
        with GATE.work("reading `resume_state`'s old hosts' states") as self._pace:
            order = self._order(d, self.spec.shard, 0)
        if self.budget is not None:
            self.budget.check(order.components, " and the old hosts' orders it continues")
        return order

    def _order(self, d: dict[str, Any], shard: ShardSpec, depth: int):
        """The order of resharded state `d` of stream `shard`."""
        if d.get("run") != self.run:
            raise InvalidSpecError(
                f"`resume_state` is a resharded state of other data (run fingerprint "
                f"{d.get('run')!r}, this spec's is {self.run!r}): reshard the states of a run "
                f"of this spec."
            )
        if d.get("shard") != [shard.index, shard.count]:
            raise InvalidSpecError(
                f"`resume_state` was resharded for shard {d.get('shard')!r}; this spec's "
                f"`shard` is [{shard.index}, {shard.count}]: give each new host its own state."
            )
        if depth >= MAX_DEPTH:
            raise InvalidSpecError(f"`resume_state` nests resharded states over {MAX_DEPTH} deep.")
        deal, entries = self._layout(d["elastic"])
        _check_deal(deal, _check_shards(entries), shard)
        fresh = order_for(self.spec, self.components, shard=shard)
        per_component = [[] for _ in fresh.components]
        for e, entry in enumerate(entries):
            if e % 64 == 0:
                self._pace()
            order, pos = self._old(entry, e, depth, fresh)
            for c, old in enumerate(self._olds(order, pos)):
                per_component[c].append(old)
        parts = [
            ReshardedOrder(olds, deal, f, self._pace)
            for olds, f in zip(per_component, fresh.components, strict=True)
        ]
        return fresh.with_components(parts)

    def _layout(self, layout: Any) -> tuple[tuple[int, int], list[dict[str, Any]]]:
        """The deal and old states of a layout, checked for shape and size."""
        try:
            deal, entries = layout["deal"], layout["from"]
            ok = isinstance(deal, list) and len(deal) == 2 and all(type(x) is int for x in deal)
            if not ok or not 0 <= deal[0] < deal[1]:
                raise ValueError(f"'deal' {deal!r} is not [k, n] with 0 <= k < n")
            if deal[1] > MAX_STREAMS:
                raise ValueError(f"'deal' {deal!r} shares among over {MAX_STREAMS} new streams")
            if not isinstance(entries, list) or not entries:
                raise ValueError("'from' is not a list of states")
            if not all(isinstance(e, dict) for e in entries):
                raise ValueError("'from' holds something other than states")
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidSpecError(f"`resume_state`'s 'elastic' is not one `reshard` wrote: {e}.")
        self._streams += len(entries)
        if self._streams > MAX_STREAMS:
            raise InvalidSpecError(
                f"`resume_state` names over {MAX_STREAMS} old streams in all: resume on the "
                f"old host count until the hosts leave an earlier change's documents."
            )
        if self._streams * len(self.components) > MAX_ORDERS:
            raise InvalidSpecError(
                f"`resume_state` names {self._streams:,} old streams of "
                f"{len(self.components)} components each, over the {MAX_ORDERS:,} orders a "
                f"resharded state may make: resume on fewer old hosts' states."
            )
        return (deal[0], deal[1]), entries

    def _old(self, entry: dict[str, Any], e: int, depth: int, fresh):
        """Old stream `e`'s order and position (where it stood when its state was saved)."""
        shard = entry["shard"]  # checked by `_check_shards`
        old_shard = ShardSpec(index=shard[0], count=shard[1])
        plain = self._shard_order(fresh, old_shard)
        if "doc" not in entry:  # a stream that took no batch: its start
            return plain, Position(mix=plain.at)
        pos = parse_state(
            {"version": 1, **entry},
            fingerprint=self._fingerprint(old_shard),
            num_docs=len(plain),
            mixture=plain if plain.at is not None else None,
            resharded=lambda d: self._order(d, old_shard, depth + 1),
            **self._rules,
        )
        base = pos.order if pos.order is not None else plain
        if pos.mix is not None and pos.mix != base.at:
            base = base.moved(pos.mix)
        return base, pos

    def _shard_order(self, fresh, shard: ShardSpec):
        """`order_for`'s order of `shard`, made from `fresh` (the same spec's on another
        shard): the quotas and seeds a shard does not change are not computed again (for
        4,096 old streams of 16 components, 1.3 s of CPU through `order_for`)."""
        parts = []
        for c, (f, (_, count)) in enumerate(zip(fresh.components, self.components, strict=True)):
            kw = dict(seed=f.seed, shuffle=f.shuffle, epochs=f.epochs)
            part = DocumentOrder(
                num_records=count, shard_index=shard.index, shard_count=shard.count, **kw
            )
            if not part.per_epoch:  # as `order_for` refuses it
                key = f"source[{c}]" if fresh.at is not None else "source"  # a mixture's
                raise InvalidSpecError(
                    f"`resume_state`'s old stream of shard [{shard.index}, {shard.count}] "
                    f"holds no documents of `{key}` ({count} in all): not a state of this data."
                )
            parts.append(part)
        return fresh.with_components(parts)

    @staticmethod
    def _olds(order: Order, pos: Position) -> list[Old]:
        """Each component's old stream at `pos` of `order`."""
        where = order.component_positions(pos.doc, pos.offset)
        return [
            Old(comp, nxt, head) for comp, (nxt, head) in zip(order.components, where, strict=True)
        ]


def settled(pos: Position) -> Position:
    """`pos` of a resharded stream as a plain position of its own shard once it is past every
    document it was dealt, in every component (else `pos` as it is): the same batches follow
    (the documents after those are its shard's, `ReshardedOrder`), and its states stop
    holding the old ones, so resharding the run again nests nothing."""
    order = pos.order
    if pos.elastic is None or order is None:
        return pos
    at = order.moved(pos.mix) if pos.mix is not None and pos.mix != order.at else order
    plain = at.settled_at(pos.doc)  # a mixture's: the same schedule position, as its origin
    if plain is None:
        return pos
    doc, mix = plain
    return Position(pos.seq, doc, pos.offset, mix)


def _check_shards(entries: list[dict[str, Any]]) -> tuple[int, int]:
    """The old streams' shards must be what `reshard` writes: L shards of one count C, each
    once, that together hold a whole shard of C / L (all of the data, when L = C: a run's
    hosts; one host's shard, when they were its servers' sub-shards). Else the old streams
    would not partition the documents. Returns that shard: (index, count)."""
    shards = [e.get("shard") for e in entries]
    for e, shard in enumerate(shards):
        ok = isinstance(shard, list) and len(shard) == 2 and all(type(x) is int for x in shard)
        if not ok or not 0 <= shard[0] < shard[1] <= MAX_SHARDS:
            raise InvalidSpecError(
                f"`resume_state`'s old stream {e} names shard {shard!r}: not a state `reshard` "
                f"wrote."
            )
    counts = {count for _, count in shards}
    indices = [index for index, _ in shards]
    count, n = max(counts), len(shards)
    if len(counts) > 1 or count % n or len(set(indices)) != n:
        raise InvalidSpecError(
            f"`resume_state`'s old streams name shards {shards[:8]}"
            f"{' ...' if n > 8 else ''}: not the {n} shards of one count `reshard` writes."
        )
    stride = count // n
    if len({index % stride for index in indices}) != 1:
        raise InvalidSpecError(
            f"`resume_state`'s old streams' shards of {count} are not one shard of {stride}'s "
            f"sub-shards: they would not read each document once."
        )
    return indices[0] % stride, stride


def _check_deal(deal: tuple[int, int], held: tuple[int, int], shard: ShardSpec) -> None:
    """The new streams that share what the old ones left are the sub-shards of the shard the
    old ones held (`reshard` deals new host j of c' share [j, c'], and `reshard_servers` a
    host's server k of N share [k, N]): shard i of C takes share [i // S, C // S] of shard
    i % S of S. Another deal would read documents another new stream reads too, or none."""
    index, stride = held
    want = [shard.index // stride, shard.count // stride]
    if shard.count % stride or shard.index % stride != index:
        raise InvalidSpecError(
            f"`resume_state`'s old streams held shard [{index}, {stride}], which this spec's "
            f"`shard` [{shard.index}, {shard.count}] is not part of: give each new host the "
            f"state `reshard` wrote for it."
        )
    if list(deal) != want:
        raise InvalidSpecError(
            f"`resume_state.elastic.deal` is {list(deal)}, but this spec's `shard` "
            f"[{shard.index}, {shard.count}] of the old streams' shard [{index}, {stride}] "
            f"takes share {want}: give each new host the state `reshard` wrote for it."
        )
