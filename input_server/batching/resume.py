"""The resume state: where a stream stands, in a form no worker count changes.

A state is the next batch's sequence number and the stream position `(doc, offset)` after a
batch (the next document of the ordered stream and the tokens of it already used), with the
data fingerprint of the spec that made it: Grain's own multiprocess iterator state is per
worker, and a state saved with 2 workers would not restore into 3. A mixture's state adds
where its interleave stands (`mixture.MixPosition`: the quotas, an origin and each
component's base, a few integers per component) and each component's own fingerprint, so a
state from another mixture is refused naming the components that differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from input_client.spec import MIX_PERIOD
from input_client.wire import decode_state
from input_server.data.mixture import MixPosition, MixtureOrder
from input_server.data.order import Order
from input_server.errors import InvalidSpecError

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a stream stands: the next batch's sequence number and the next unused token."""

    seq: int = 0
    doc: int = 0
    offset: int = 0
    mix: MixPosition | None = None  # a mixture's interleave (None: one source)
    # A resharded stream's old layout, written back in every state (`data.elastic`), and the
    # order it makes (None: the spec's own shard's).
    elastic: dict[str, Any] | None = None
    order: Any = dataclasses.field(default=None, compare=False, repr=False)

    def state(
        self,
        fingerprint: str,
        components: list[list[str]] | None = None,
        *,
        run: str = "",
        shard: tuple[int, int] = (0, 1),
    ) -> dict[str, Any]:
        """The JSON-able state a batch carries; `components`: a mixture's [name, fingerprint]
        pairs; `run`: the data fingerprint without the shard and `shard` (index, count),
        which `input_client.reshard` matches the states of a run's hosts by."""
        out = {
            "version": STATE_VERSION,
            "fingerprint": fingerprint,
            "run": run,
            "shard": list(shard),
            "seq": self.seq,
            "doc": self.doc,
            "offset": self.offset,
        }
        if self.mix is not None:
            out["mixture"] = self.mix.to_json()
            if components is not None:
                out["mixture"]["components"] = components
        if self.elastic is not None:
            out["elastic"] = self.elastic
        return out


MAX_SEQ = 1 << 62
MAX_DOC = (1 << 63) - (1 << 40)


def _position(d: dict[str, Any]) -> Position:
    values = {k: d[k] for k in ("seq", "doc", "offset")}
    for key, v in values.items():
        if type(v) is not int or not 0 <= v < 1 << 63:
            raise ValueError(f"{key!r} must be a non-negative integer, got {v!r}")
    # Sequence numbers travel as uint64 and grow by one a batch, document ordinals (int64 in
    # the document order's arithmetic) by one a document, and a forever stream has no last
    # one: a state near the top would overflow later, mid-stream. Either bound is beyond any
    # training run, and leaves a stream resumed just below it 2^40 documents (2^62 batches)
    # whose states still read back.
    for key, top in (("seq", MAX_SEQ), ("doc", MAX_DOC)):
        if values[key] >= top:
            raise ValueError(f"{key!r} {values[key]} is out of range (below {top})")
    return Position(**values)


def parse_state(
    state: bytes | dict[str, Any] | None,
    *,
    fingerprint: str,
    num_docs: int,
    splits_documents: bool = True,
    chunk_len: int = 0,
    mixture: MixtureOrder | None = None,
    components: list[list[str]] | None = None,
    resharded: Callable[[dict[str, Any]], Order] | None = None,
) -> Position:
    """Reads a resume state sent back by a client; refuses one made for other data.

    Args:
      state: the state's JSON bytes (or the dict), as a batch carried it; empty = the start.
      fingerprint: the data fingerprint of the stream's spec.
      num_docs: documents in the ordered stream (a position past them is refused).
      splits_documents: whether the packing continues a document in the next batch; if not,
        a position inside a document (an `offset`) is refused, unless `chunk_len`. An offset
        past its document's tokens is refused when the stream reaches it (`pack.DocCursor`):
        that takes the document's tokens.
      chunk_len: a chunked document's pieces start every `chunk_len` tokens
        (`batch.long_documents` chunk; 0: not chunked), so a packing that never splits a piece
        stops inside a document only there: another offset is refused.
      mixture: the stream's mixture order, fresh (then `num_docs` is ignored: the state's own
        interleave decides it); `components` its [name, fingerprint] pairs. A state made
        under other weights of the same named components continues each component where
        it was (`MixtureOrder.rebased`), from document 0 of the new interleave.
      resharded: reads a resharded state (`input_client.reshard`): checks it is this run's
        and this shard's, and gives the order its layout makes (`batching.resharded`), which
        the position is then read against instead of `num_docs` / `mixture`.

    Raises:
      InvalidSpecError: the state is not one this server wrote, or not for this data.
    """
    if not state:
        return Position()
    try:
        d = decode_state(state) if isinstance(state, bytes) else dict(state)
        version = d["version"]
        fp = d.get("fingerprint") if "elastic" in d else d["fingerprint"]
        pos = _position(d)
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise InvalidSpecError(f"`resume_state` is not a state this server wrote: {e}.") from e
    if version != STATE_VERSION:
        raise InvalidSpecError(
            f"`resume_state` has version {version!r}; this server reads version {STATE_VERSION}."
        )
    base = None
    if "elastic" in d:
        if resharded is None:
            raise InvalidSpecError("`resume_state` is a resharded state's, inside another.")
        base = resharded(d)
        if base.at is not None:  # a mixture's: its interleave, read as a mixture's state
            mixture = base
            if "mixture" not in d:  # as `reshard` writes it: the interleave's start
                d["mixture"] = base.at.to_json()
        else:
            mixture, num_docs = None, len(base)
    elif fp != fingerprint:
        raise InvalidSpecError(
            f"`resume_state` was made for other data (fingerprint {fp!r}, this spec's is "
            f"{fingerprint!r}): resume with the spec that produced it"
            f"{_mixture_difference(d, components)}."
        )
    if mixture is not None:
        pos, num_docs = _in_mixture(d, pos, mixture)
    elif "mixture" in d:
        raise InvalidSpecError("`resume_state` is a mixture's; this spec reads one source.")
    _check_range(pos, num_docs, splits_documents, chunk_len)
    if base is not None:
        pos = dataclasses.replace(pos, elastic=d["elastic"], order=base)
    return pos


def _where(pos: Position) -> dict[str, int]:
    return {"seq": pos.seq, "doc": pos.doc, "offset": pos.offset}


def _check_range(pos: Position, num_docs: int, splits_documents: bool, chunk_len: int) -> None:
    """Refuses a position past the stream's documents, or inside a document where this
    stream's packing never stops."""
    if pos.doc > num_docs:
        raise InvalidSpecError(
            f"`resume_state` position {_where(pos)} is out of range: `doc` is past "
            f"the stream's {num_docs} documents."
        )
    if pos.offset and pos.doc == num_docs:
        raise InvalidSpecError(
            f"`resume_state` position {_where(pos)} is out of range: `offset` "
            f"inside a document past the stream's end."
        )
    if pos.offset and not splits_documents and (not chunk_len or pos.offset % chunk_len):
        raise InvalidSpecError(
            f"`resume_state` position {_where(pos)} is out of range: this stream's "
            + (
                f"packing stops inside a document only where a chunk of it ends, so its "
                f"`offset` is a multiple of `batch.seq_len` {chunk_len}."
                if chunk_len
                else "packing never stops inside a document, so its `offset` is 0."
            )
        )


def _mixture_difference(d: dict[str, Any], components: list[list[str]] | None) -> str:
    """What differs between the state's mixture and this spec's, for the refusal."""
    mix = d.get("mixture")
    theirs = mix.get("components") if isinstance(mix, dict) else None
    if components is None or not isinstance(theirs, list):
        if components is not None or isinstance(theirs, list):
            return " (one is a mixture, the other one source)"
        return ""
    try:
        then = {str(n): str(f) for n, f in theirs}
    except (TypeError, ValueError):
        return ""
    now = dict(components)
    said = []
    if gone := [n for n in then if n not in now]:
        said.append(f"components {gone} are not in this spec")
    if new := [n for n in now if n not in then]:
        said.append(f"components {new} are new")
    if changed := [n for n in now if n in then and then[n] != now[n]]:
        said.append(f"components {changed} changed (paths, format or fields)")
    if not said and [list(c) for c in theirs] == components:
        unnamed = any(n.startswith("source[") for n, _ in components)
        said.append(
            "only weights or other tables differ"
            + (
                "; to resume under new weights, name every component (`source[i].name`)"
                if unnamed
                else ""
            )
        )
    return f": {'; '.join(said)}" if said else ""


def _ints(v: Any, key: str, n: int | None = None) -> list[int]:
    ok = isinstance(v, list) and (n is None or len(v) == n)
    if not ok or not all(type(x) is int and -(1 << 62) < x < 1 << 62 for x in v):
        raise ValueError(f"mixture {key!r} must list {n or 'some'} integers, got {v!r}")
    return v


def _bounded(
    quotas: list[int], origin: int, bases: list[int], pos: Position, order: MixtureOrder
) -> None:
    """What a state this server wrote satisfies, checked before its interleave is built (a
    forged one could ask for a schedule of 2^40 places, or ordinals past int64): a period of
    at most MIX_PERIOD, an origin inside it, and bases from -quota (a rebase's least) to the
    component's documents."""
    period = sum(quotas)
    if min(quotas) < 1 or period > MIX_PERIOD:
        raise ValueError(f"mixture quotas {quotas} must be positive, at most {MIX_PERIOD} in all")
    if not 0 <= origin < period:
        raise ValueError(f"mixture origin {origin} must lie in the period of {period}")
    for c, (b, q) in enumerate(zip(bases, quotas, strict=True)):
        top = min(len(order.components[c]), MAX_DOC - pos.doc)
        if not -q <= b <= top:
            raise ValueError(f"mixture base {b} of component {c} must be from {-q} to {top}")


def _in_mixture(d: dict[str, Any], pos: Position, order: MixtureOrder) -> tuple[Position, int]:
    """The position in this spec's mixture (rebased when the quotas changed), and how many
    documents its interleave holds from there."""
    n = len(order.components)
    try:
        mix = d["mixture"]
        quotas = _ints(mix["quotas"], "quotas", n)
        origin = _ints([mix["origin"]], "origin")[0]
        bases = _ints(mix["bases"], "bases", n)
        _bounded(quotas, origin, bases, pos, order)
        then = order.moved(MixPosition(tuple(quotas), origin, tuple(bases)))
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidSpecError(f"`resume_state` is not a mixture state this server wrote: {e}.")
    if pos.doc > len(then):
        raise InvalidSpecError(
            f"`resume_state` position {pos.doc} is out of range: `doc` is past the mixture's "
            f"{len(then)} documents."
        )
    if pos.offset and pos.doc == len(then):
        raise InvalidSpecError(
            f"`resume_state` position {pos.doc} with `offset` {pos.offset} is out of range: "
            f"the mixture's {len(then)} documents end there."
        )
    if tuple(quotas) != order.at.quotas:  # the weights changed: each component goes on
        at = then.rebased(order.at.quotas, pos.doc, pos.offset)
        pos = dataclasses.replace(pos, doc=0, mix=at)
        return pos, len(order.moved(at))
    return dataclasses.replace(pos, mix=then.at), len(then)
