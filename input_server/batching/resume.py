"""The resume state: where a stream stands, in a form no worker count changes.

A state is the next batch's sequence number and the stream position `(doc, offset)` after a
batch (the next document of the ordered stream and the tokens of it already used), with the
data fingerprint of the spec that made it: Grain's own multiprocess iterator state is per
worker, and a state saved with 2 workers would not restore into 3.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from input_client.wire import decode_state
from input_server.errors import InvalidSpecError

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a stream stands: the next batch's sequence number and the next unused token."""

    seq: int = 0
    doc: int = 0
    offset: int = 0

    def state(self, fingerprint: str) -> dict[str, Any]:
        """The JSON-able state a batch carries."""
        return {
            "version": STATE_VERSION,
            "fingerprint": fingerprint,
            "seq": self.seq,
            "doc": self.doc,
            "offset": self.offset,
        }


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
) -> Position:
    """Reads a resume state sent back by a client; refuses one made for other data.

    Args:
      state: the state's JSON bytes (or the dict), as a batch carried it; empty = the start.
      fingerprint: the data fingerprint of the stream's spec.
      num_docs: documents in the ordered stream (a position past them is refused).
      splits_documents: whether the packing continues a document in the next batch; if not,
        a position inside a document (an `offset`) is refused. An offset past its document's
        tokens is refused when the stream reaches it (`pack.DocCursor`): that takes the
        document's tokens.

    Raises:
      InvalidSpecError: the state is not one this server wrote, or not for this data.
    """
    if not state:
        return Position()
    try:
        d = decode_state(state) if isinstance(state, bytes) else dict(state)
        version, fp = d["version"], d["fingerprint"]
        pos = _position(d)
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise InvalidSpecError(f"`resume_state` is not a state this server wrote: {e}.") from e
    if version != STATE_VERSION:
        raise InvalidSpecError(
            f"`resume_state` has version {version!r}; this server reads version {STATE_VERSION}."
        )
    if fp != fingerprint:
        raise InvalidSpecError(
            f"`resume_state` was made for other data (fingerprint {fp!r}, this spec's is "
            f"{fingerprint!r}): resume with the spec that produced it."
        )
    if pos.doc > num_docs:
        raise InvalidSpecError(
            f"`resume_state` position {dataclasses.asdict(pos)} is out of range: `doc` is past "
            f"the stream's {num_docs} documents."
        )
    if pos.offset and (not splits_documents or pos.doc == num_docs):
        raise InvalidSpecError(
            f"`resume_state` position {dataclasses.asdict(pos)} is out of range: this stream's "
            f"packing never stops inside a document, so its `offset` is 0."
            if not splits_documents
            else f"`resume_state` position {dataclasses.asdict(pos)} is out of range: `offset` "
            f"inside a document past the stream's end."
        )
    return pos
