"""What the client checks of a server's messages before its training loop sees them.

A server is not trusted (a buggy one, another release, a compromised member of a pool): an
800 MB batch once OOM-killed a trainer, and batches of another shape or dtype reached the loop
silently. So a stream's channel receives messages only up to a limit sized from its spec
(`Expected.receive_limit`), and every batch is checked against the spec before it is decoded:
exactly the compact form's tensors, `inputs` [size, seq_len] of uint16 or int32, segment lengths
that fit their rows, and a resume state of bounded size that is a JSON object for the batch
after this one. A failed check raises `BadBatch`, which the iterator turns into a `StreamError`
naming the server.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from input_client.proto import pb
from input_client.wire import (
    MAX_BATCHES_PER_MESSAGE,
    PACKED_KEYS,
    Buffers,
    decode_state,
    expand_packed,
    is_resume_state,
    packed_runs,
)

# A state's bytes (`input_server.batching.resume`): ~150 for one source (a version, a 64-hex
# fingerprint, three integers); a mixture adds per component its quota, base, name and
# fingerprint. These bounds leave room for all of that, with the name JSON-escaped
# (a \uXXXX surrogate pair is 12 bytes a character), and refuse a state 100 x too big.
STATE_BASE_BYTES = 16 << 10
STATE_BYTES_PER_COMPONENT = 512
# A Tensor's or Batch's own fields (name, dtype, shape, sequence number, counts) around its data.
MESSAGE_FRAMING_BYTES = 1 << 10
# Room above the spec's worst message: protobuf's varints and tags; never a second batch.
RECEIVE_HEADROOM_BYTES = 64 << 10
# gRPC's channel arguments are C ints.
_INT_MAX = (1 << 31) - 1
_ID_DTYPES = ("uint16", "int32")  # ids travel as uint16 when the vocabulary fits (wire.py)


class BadBatch(ValueError):
    """A message from the server that does not fit the stream's spec; the text says how."""


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a stream's batches must be, from its spec.

    Attributes:
      size: rows per batch (`batch.size`).
      seq_len: tokens per row (`batch.seq_len`).
      state_bytes: the most bytes a batch's resume state may have.
    """

    size: int
    seq_len: int
    state_bytes: int

    @property
    def batch_bytes(self) -> int:
        """A batch's most bytes on the wire: int32 ids, at most one segment a token (int32),
        a count per row, its state and the fields around them."""
        tokens = self.size * self.seq_len
        return 4 * tokens + 4 * tokens + 4 * self.size + self.state_bytes + MESSAGE_FRAMING_BYTES

    @property
    def receive_limit(self) -> int:
        """The stream channel's `grpc.max_receive_message_length`: the most batches the server
        puts in one message (`serving/coalesce.py`), each at its largest, plus headroom."""
        limit = MAX_BATCHES_PER_MESSAGE * self.batch_bytes + RECEIVE_HEADROOM_BYTES
        return min(limit, _INT_MAX)

    def shape(self) -> str:
        return f"[{self.size}, {self.seq_len}]"


def expected_of(spec: pb.PipelineSpec) -> Expected:
    """The checks for the batches of `spec` (a request's, or a server's named pipeline's).

    Raises:
      BadBatch: the spec has no batch shape (a named pipeline the server describes so).
    """
    size, seq_len = spec.batch.size, spec.batch.seq_len
    if size <= 0 or seq_len <= 0:
        raise BadBatch(f"a pipeline whose batch shape is [{size}, {seq_len}]")
    components = list(spec.mixture) or [spec.source]
    state = STATE_BASE_BYTES + sum(STATE_BYTES_PER_COMPONENT + 12 * len(c.name) for c in components)
    return Expected(size=size, seq_len=seq_len, state_bytes=state)


def check_message(message: Any) -> None:
    """A message's own shape: at most MAX_BATCHES_PER_MESSAGE batches, one level deep.

    Raises:
      BadBatch: too many batches, or a following batch with followers of its own (which
        `wire.batches_of` would silently drop).
    """
    n = len(message.following) + 1
    if n > MAX_BATCHES_PER_MESSAGE:
        raise BadBatch(
            f"a message of {n} batches (a server sends at most {MAX_BATCHES_PER_MESSAGE})"
        )
    if any(len(b.following) for b in message.following):
        raise BadBatch("a message whose following batches have followers of their own")


def _array(t: Any, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Tensor `t` as an array, after checking its dtype, shape and byte count."""
    if t.dtype not in dtypes:
        raise BadBatch(
            f"`{t.name}` of dtype {t.dtype[:40]!r}; the client reads {' or '.join(dtypes)}"
        )
    if tuple(t.shape) != shape:
        got = list(t.shape)[:8]
        raise BadBatch(f"`{t.name}` of shape {got}; this stream's is {list(shape)}")
    dtype = np.dtype(t.dtype).newbyteorder("<")
    data = t.data  # each read of the field copies its bytes
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise BadBatch(f"`{t.name}` of {len(data)} bytes for shape {list(shape)} of {t.dtype}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def decode_checked(
    msg: Any, expected: Expected, buffers: Buffers | None = None
) -> dict[str, np.ndarray]:
    """MaxText's six int32 [size, seq_len] arrays from one batch of the compact form, after
    checking it against `expected` (into one of `buffers`, when given).

    Raises:
      BadBatch: other tensors, a dtype or shape the spec does not give, byte counts that do
        not match, or segment lengths that do not fit their rows.
    """
    names = [t.name[:40] for t in msg.tensors]
    if sorted(names) != sorted(PACKED_KEYS):
        raise BadBatch(f"the tensors {names[:8]}; a batch is exactly {list(PACKED_KEYS)}")
    t = {x.name: x for x in msg.tensors}
    size, seq_len = expected.size, expected.seq_len
    inputs = _array(t["inputs"], _ID_DTYPES, (size, seq_len))
    per_row = _array(t["segments_per_row"], ("int32",), (size,))
    k = list(t["segment_lengths"].shape)
    if len(k) != 1 or not 0 <= k[0] <= size * seq_len:
        raise BadBatch(
            f"`segment_lengths` of shape {k[:8]}; at most one segment a token "
            f"({size * seq_len}) fits a batch of {expected.shape()}"
        )
    lengths = _array(t["segment_lengths"], ("int32",), (k[0],))
    if per_row.min() < 0 or (k[0] and lengths.min() < 0):
        raise BadBatch("negative segment counts or lengths")
    if int(per_row.sum(dtype=np.int64)) != k[0]:
        raise BadBatch(
            f"`segments_per_row` counting {int(per_row.sum(dtype=np.int64))} segments for "
            f"{k[0]} `segment_lengths`"
        )
    runs = packed_runs(lengths, per_row, seq_len)  # made once: the checks and the expansion
    if runs.padding.min() < 0:
        row = int(np.argmax(runs.padding < 0))
        raise BadBatch(
            f"row {row} whose segments hold {seq_len - int(runs.padding[row])} tokens, more "
            f"than its {seq_len}"
        )
    tokens = size * seq_len - int(runs.padding.sum())
    if msg.num_tokens != tokens:
        raise BadBatch(f"`num_tokens` {msg.num_tokens} for segments of {tokens} tokens")
    return expand_packed(inputs, lengths, per_row, runs, buffers)


def checked_state(msg: Any, expected: Expected) -> dict[str, Any]:
    """The resume state batch `msg` carries, checked before the client keeps it (a
    `get_state()` goes into a checkpoint and back to a server).

    Raises:
      BadBatch: a state over `expected.state_bytes`, not UTF-8 JSON of an object, or whose
        `seq` is not the next batch's sequence number.
    """
    blob = msg.state
    if len(blob) > expected.state_bytes:
        raise BadBatch(
            f"a resume state of {len(blob)} bytes; this spec's are at most {expected.state_bytes}"
        )
    try:
        state = decode_state(blob)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadBatch(f"a resume state that is not UTF-8 JSON of an object ({e})") from None
    want = msg.sequence_number + 1
    if not is_resume_state(state) or state["seq"] != want:
        raise BadBatch(
            f"a resume state whose 'seq' is {str(state.get('seq'))[:40]}, not {want} "
            f"(the batch after this one)"
        )
    return state
