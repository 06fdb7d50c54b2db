"""`wire.expand_packed` (the client's decode of the compact form) gives MaxText's six arrays as
their definition reads, for any layout a server may send: full rows, padded and empty rows,
zero-length segments, ids as uint16 or int32; into buffers used again (`wire.Buffers`) only once
nothing views them."""

from __future__ import annotations

import weakref

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from input_client.wire import FIELDS, Buffers, expand_packed


@st.composite
def layouts(draw):
    """A batch in compact form: each row's segment lengths (0 allowed), filling at most
    `seq_len`, and ids of the wire's dtypes."""
    rows = draw(st.integers(1, 5))
    seq_len = draw(st.integers(1, 12))
    segments = []
    for _ in range(rows):
        row, room = [], seq_len
        for _ in range(draw(st.integers(0, 4))):
            n = draw(st.integers(0, room))
            row.append(n)
            room -= n
        segments.append(row)
    dtype = draw(st.sampled_from([np.uint16, np.int32]))
    top = np.iinfo(np.uint16).max if dtype == np.uint16 else (1 << 31) - 1
    ids = draw(st.lists(st.integers(0, top), min_size=rows * seq_len, max_size=rows * seq_len))
    return np.array(ids, dtype).reshape(rows, seq_len), segments


def _by_definition(inputs: np.ndarray, segments: list[list[int]]) -> dict[str, list]:
    """Segment ids 1, 2, ... within a row (an empty segment takes its id too), positions from 0
    within a segment, 0 for padding; targets shifted left by one, 0 at the end."""
    seg, pos = [], []
    for row in segments:
        s, p = [], []
        for k, n in enumerate(row):
            s += [k + 1] * n
            p += list(range(n))
        pad = inputs.shape[1] - len(s)
        seg.append(s + [0] * pad)
        pos.append(p + [0] * pad)
    ids = inputs.astype(np.int64).tolist()
    out = {"inputs": ids, "inputs_segmentation": seg, "inputs_position": pos}
    for name, src in (("targets", ids), ("targets_segmentation", seg), ("targets_position", pos)):
        out[name] = [r[1:] + [0] for r in src]
    return out


def _compact(segments: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([n for row in segments for n in row], np.int32)
    return lengths, np.array([len(row) for row in segments], np.int32)


# Shared by the examples below: buffers of earlier examples' shapes are written again.
_BUFFERS = Buffers(keep=3)


@settings(max_examples=400, deadline=None)
@given(layout=layouts(), pooled=st.booleans())
def test_expand_packed_is_its_definition(layout, pooled):
    inputs, segments = layout
    got = expand_packed(inputs, *_compact(segments), buffers=_BUFFERS if pooled else None)
    want = _by_definition(inputs, segments)
    assert list(got) == list(FIELDS)
    for name in FIELDS:
        assert got[name].dtype == np.int32 and got[name].shape == inputs.shape, name
        assert got[name].tolist() == want[name], name


def _batch(seed: int, buffers: Buffers) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    segments = [[3, 2], [4], [1, 1, 1]]
    return expand_packed(
        rng.integers(0, 1000, (3, 6), np.int32), *_compact(segments), None, buffers
    )


def test_a_batch_still_held_is_never_written_over():
    buffers = Buffers(keep=3)
    held = _batch(0, buffers)
    before = {k: v.copy() for k, v in held.items()}
    for seed in range(1, 10):
        _batch(seed, buffers)  # dropped at once: its buffer is free again
    for name in FIELDS:
        assert np.array_equal(held[name], before[name]), name


def test_a_buffer_nothing_views_is_used_again():
    buffers = Buffers(keep=3)
    first = _batch(0, buffers)
    buffer = weakref.ref(first["targets"].base)
    kept = first["inputs"][1:]  # a view of a view still holds the buffer
    del first
    assert _batch(1, buffers)["inputs"].base is not buffer()
    del kept
    assert _batch(2, buffers)["inputs"].base is buffer()
