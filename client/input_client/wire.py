"""Everything about the bytes on the wire, both directions.

A batch travels as `Tensor` messages of raw little-endian bytes, in compact form: `inputs` plus
each row's segment lengths (`PACKED_KEYS`). Segment ids, positions and the three shifted
`targets*` arrays follow from those, so the client derives them (`expand_packed`, MaxText's six
`FIELDS`) instead of the server computing and sending five more arrays per batch. Token ids of
a small vocabulary travel as uint16 (`narrow_ids`). Small batches share a message: the first,
then `Batch.following` (`batches_of`). The resume state travels as canonical JSON
(`encode_state`). Client and server both use this module; neither writes these names elsewhere.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from input_client.proto import pb

# The wire protocol: what a client must understand to read a server's batches. Client and
# server both say theirs (the stream request, the info reply), and refuse another.
#   1: compact packed batches (`inputs` + segment lengths), one batch a message.
#   2: token ids as uint16 when the vocabulary fits; small batches share a message
#      (`Batch.following`).
#   3: the stream is bidirectional: the client's later requests report the batches its loop
#      has taken (`batches_taken`), within its `window` (flow control).
PROTOCOL_VERSION = 3

# A stream call's header that names the client process making it (random, one per process).
# gRPC shows a server every Unix-socket peer alike, so the server's set-up queue shares its
# places between the clients of one peer by this (`input_server/batching/pacing.py`). A client
# may send any value: it keeps well-behaved clients of one peer apart, and proves nothing.
CLIENT_KEY = "input-client"
# What a server's refusal for a full set-up queue says (RESOURCE_EXHAUSTED, while it sets up
# others' resumed states): a fresh stream refused so waits for a place and retries
# (`iterator.py`); no other refusal is retried that way.
SETUP_QUEUE_FULL = "the server's set-up queue is full"


def protocol_mismatch(server: str, server_version: int, client_version: int) -> str | None:
    """The refusal both sides give when their wire protocols differ (None when they agree);
    `server` names the server (its address and release, or "this server (...)")."""
    if server_version == client_version:
        return None

    def words(v: int) -> str:
        return str(v) if v else "one from before versions were sent"

    return (
        f"{server} speaks wire protocol {words(server_version)}; the client speaks "
        f"{words(client_version)}. Use the client of the same input-server release as the "
        f"server."
    )


# The compact form's tensors: every row is its segments end to end, then padding.
PACKED_KEYS = ("inputs", "segment_lengths", "segments_per_row")
# MaxText's six arrays, which the client derives from the compact form.
FIELDS = (
    "inputs",
    "inputs_segmentation",
    "inputs_position",
    "targets",
    "targets_segmentation",
    "targets_position",
)
# Vocabularies up to this size send their ids as uint16.
UINT16_VOCAB = 1 << 16
# Batches can be tens of MB (256 x 8192 x six int32 arrays is ~50 MB); gRPC's 4 MiB default
# receive limit would refuse them. Both sides' channels and servers use these options.
MESSAGE_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
# The most batches one message carries (`Batch.following`; the server's `serving/coalesce.py`):
# a client sizes its receive limit by it.
MAX_BATCHES_PER_MESSAGE = 16
# A client's unary calls (GetInfo, DescribeTokenizer) answer in a few KB; a server's info with
# many named pipelines of large mixtures stays far below this. Streams get their own channel,
# whose limit is sized from the spec (`_server_checks.Expected.receive_limit`).
CLIENT_RECEIVE_LIMIT = 64 << 20


def client_message_options(receive_limit: int = CLIENT_RECEIVE_LIMIT) -> list[tuple[str, int]]:
    """A client channel's message options: it sends what it must, and receives no more than
    `receive_limit` bytes a message (a server is not trusted with the client's memory)."""
    return [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", receive_limit),
    ]


def narrow_ids(inputs: np.ndarray, vocab_size: int | None) -> np.ndarray:
    """Token ids as they travel: uint16 when the vocabulary fits (half the bytes of int32;
    gRPC's cost per batch grows with its bytes), else as they are. `expand_packed` widens."""
    if vocab_size is not None and vocab_size <= UINT16_VOCAB:
        return inputs.astype(np.uint16)
    return inputs


def compact_arrays(
    inputs: np.ndarray,
    segment_lengths: np.ndarray,
    segments_per_row: np.ndarray,
    vocab_size: int | None,
) -> dict[str, np.ndarray]:
    """The tensors a packed batch travels as, by their `PACKED_KEYS` names."""
    return dict(
        zip(
            PACKED_KEYS,
            (narrow_ids(inputs, vocab_size), segment_lengths, segments_per_row),
            strict=True,
        )
    )


def batches_of(message: Any) -> tuple[Any, ...]:
    """The batches a `Batch` message carries, in order: itself, then its `following`."""
    return (message, *message.following)


def encode_tensors(arrays: Mapping[str, np.ndarray], into: Any = None) -> Any:
    """One `Tensor` per array, in little-endian byte order: a list, or added to `into` (a
    message's repeated `tensors` field), which saves copying the bytes into it later."""
    out = [] if into is None else into
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        fields = {"name": name, "dtype": a.dtype.name, "shape": a.shape, "data": a.tobytes()}
        if into is None:
            out.append(pb.Tensor(**fields))
        else:
            into.add(**fields)
    return out


def decode_tensors(tensors: Any) -> dict[str, np.ndarray]:
    """Arrays that view the message's bytes (`np.frombuffer`, no copy; read-only)."""
    out = {}
    for t in tensors:
        dtype = np.dtype(t.dtype).newbyteorder("<")
        out[t.name] = np.frombuffer(t.data, dtype=dtype).reshape(tuple(t.shape))
    return out


def shift_left(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """`a[:, t + 1]` at `t`, 0 at the last position: MaxText's targets from its inputs (as
    `dtype`, default `a`'s)."""
    out = np.empty(a.shape, dtype or a.dtype)
    out[:, :-1] = a[:, 1:]
    out[:, -1] = 0
    return out


@functools.lru_cache(maxsize=4)
def _indices(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 as int32, made once for a batch's size (read-only: shared)."""
    out = np.arange(n, dtype=np.int32)
    out.flags.writeable = False
    return out


# Rows of the one buffer that holds a batch's six arrays: each array's block starts 2 KiB past a
# multiple of 4 KiB from the one before, so the shift that makes a `targets*` array from its
# source never stores to an address 4 KiB-aliased with the loads just before it (whole-page
# blocks made that copy run ~15 x slower, measured).
_PAGE = 4096


def _block_stride(n: int) -> int:
    """int32 elements from one array's block to the next for `n` tokens."""
    return (-(-4 * n // _PAGE) * _PAGE + _PAGE // 2) // 4


class Buffers:
    """The buffers a stream's batches are expanded into, used again once nothing views them.

    A batch's six arrays (`expand_packed`) are views of one buffer, and every numpy view holds
    its buffer; when only this pool still refers to a buffer, the loop is done with that batch
    and the next one can be written there. Fresh memory costs a page fault a page, 24 bytes a
    token, on its first write: a fifth of the expansion on a 2-core host, more under gVisor.
    Not thread-safe: one fetch thread takes from it.
    """

    def __init__(self, keep: int):
        """`keep`: the most buffers held (those in use count: a pool of fewer than the batches
        a client holds at once allocates each batch anew)."""
        self._keep = keep
        self._held: list[np.ndarray] = []

    def take(self, shape: tuple[int, int]) -> np.ndarray:
        """An int32 buffer of `shape` that nothing else refers to: one of the pool's, else new."""
        for buf in self._held:
            # The list, `buf` and getrefcount's argument: no array views it any more.
            if buf.shape == shape and sys.getrefcount(buf) == 3:
                return buf
        buf = np.empty(shape, np.int32)
        if self._keep > 0:
            self._held.append(buf)
            if len(self._held) > self._keep:
                del self._held[0]  # still in use: its views keep it alive, this pool forgets it
        return buf


class Runs(NamedTuple):
    """A compact batch as runs of tokens, row after row each row's segments then its padding
    run (maybe empty); `packed_runs` makes it.

    Attributes:
      length: each run's tokens (int64).
      segment_id: each run's segment id within its row, 1, 2, ...; 0 for padding (int32).
      start: each run's first token's index in the batch (int32).
      padding: each row's padding run's length (int64); negative where a row's segments hold
        more than `seq_len` tokens (a server's error: `_server_checks` refuses it).
    """

    length: np.ndarray
    segment_id: np.ndarray
    start: np.ndarray
    padding: np.ndarray


def packed_runs(segment_lengths: np.ndarray, segments_per_row: np.ndarray, seq_len: int) -> Runs:
    """The runs of a batch whose rows hold `segments_per_row` of `segment_lengths` (row after
    row; non-negative, and as many lengths as the counts sum to) in rows of `seq_len`."""
    rows, k = len(segments_per_row), len(segment_lengths)
    per_row = segments_per_row.astype(np.int64)
    row_ends = np.cumsum(per_row)
    cum = np.zeros(k + 1, np.int64)
    np.cumsum(segment_lengths, out=cum[1:])
    padding = seq_len - (cum[row_ends] - cum[row_ends - per_row])
    pad_slot = row_ends + np.arange(rows)
    is_segment = np.ones(k + rows, bool)
    is_segment[pad_slot] = False
    length = np.empty(k + rows, np.int64)
    length[is_segment] = segment_lengths
    length[pad_slot] = padding
    # Ids count 1, 2, ... from each row's first run; the padding run's is 0.
    segment_id = np.arange(1, k + rows + 1, dtype=np.int32)
    segment_id -= np.repeat((pad_slot - per_row).astype(np.int32), per_row + 1)
    segment_id[pad_slot] = 0
    start = np.cumsum(length)
    start -= length
    return Runs(length, segment_id, start.astype(np.int32), padding)


def expand_packed(
    inputs: np.ndarray,
    segment_lengths: np.ndarray,
    segments_per_row: np.ndarray,
    runs: Runs | None = None,
    buffers: Buffers | None = None,
) -> dict[str, np.ndarray]:
    """MaxText's six arrays from the compact form.

    `inputs` may hold uint16 ids (a small vocabulary's wire form); all six arrays are int32,
    views of one buffer (one allocation a batch, not six). `segment_lengths` lists every row's
    segment lengths, row after row; `segments_per_row` says how many belong to each row
    (`runs`: their `packed_runs`, when the caller made them already; `buffers`: where the
    buffer comes from, else it is new). Segment ids count 1, 2,
    ... within a row (0 = padding), positions 0, 1, ... within a segment; targets are the
    inputs shifted left by one, the last position 0, and so are targets_segmentation and
    targets_position.
    """
    rows, seq_len = inputs.shape
    n = rows * seq_len
    if runs is None:
        runs = packed_runs(segment_lengths, segments_per_row, seq_len)
    # Each pass over the batch's tokens is most of the client's time, and so is each numpy
    # call on a batch of short documents: the six arrays take seven passes and no call a row.
    shape = (6, _block_stride(n))
    buf = np.empty(shape, np.int32) if buffers is None else buffers.take(shape)
    ids, seg, pos = buf[0, :n], buf[1, :n], buf[2, :n]
    np.copyto(ids, inputs.reshape(-1))
    seg[:] = np.repeat(runs.segment_id, runs.length)
    np.subtract(_indices(n), np.repeat(runs.start, runs.length), out=pos)
    pad = runs.padding
    padding = int(pad.sum())
    if padding:  # a padding run counted positions like a segment: they are 0
        first = np.arange(seq_len, n + 1, seq_len) - pad
        pos[np.repeat(first - (np.cumsum(pad) - pad), pad) + np.arange(padding)] = 0
    # The three targets at once: each source shifted left across the whole batch, then each
    # row's last position (which took the next row's first token) set to 0.
    buf[3:, : n - 1] = buf[:3, 1:n]
    buf[3:, seq_len - 1 : n : seq_len] = 0
    return dict(zip(FIELDS, (a.reshape(rows, seq_len) for a in buf[:, :n]), strict=True))


def decode_batch(tensors: Any) -> dict[str, np.ndarray]:
    """A batch message's arrays, expanded to MaxText's six when it came in compact form."""
    arrays = decode_tensors(tensors)
    if set(arrays) == set(PACKED_KEYS):
        return expand_packed(**arrays)
    return arrays


def encode_state(state: Mapping[str, Any]) -> bytes:
    """A resume state as it travels: canonical JSON (sorted keys, no spaces, no NaN or
    Infinity, which JSON does not have)."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def is_resume_state(state: Any) -> bool:
    """Whether `state` can be a stream's resume state (the server checks the rest): a dict
    with a non-negative integer `seq`."""
    return isinstance(state, dict) and type(state.get("seq")) is int and state["seq"] >= 0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a state can hold")


def decode_state(blob: bytes) -> dict[str, Any]:
    """The state a batch carried; {} for none. Raises ValueError for anything but a JSON
    object of strict JSON (Python's reader would take NaN and Infinity)."""
    if not blob:
        return {}
    state = json.loads(blob.decode(), parse_constant=_no_constant)
    if not isinstance(state, dict):
        raise ValueError(f"a state is a JSON object, got {type(state).__name__}")
    return state
