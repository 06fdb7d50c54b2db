"""`wire.expand_packed` (the client's decode of the compact form) gives MaxText's six arrays as
their definition reads, for any layout a server may send: full rows, padded and empty rows,
zero-length segments, ids as uint16 or int32."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from input_client.wire import FIELDS, expand_packed


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


@settings(max_examples=400, deadline=None)
@given(layout=layouts())
def test_expand_packed_is_its_definition(layout):
    inputs, segments = layout
    lengths = np.array([n for row in segments for n in row], np.int32)
    per_row = np.array([len(row) for row in segments], np.int32)
    got = expand_packed(inputs, lengths, per_row)
    want = _by_definition(inputs, segments)
    assert list(got) == list(FIELDS)
    for name in FIELDS:
        assert got[name].dtype == np.int32 and got[name].shape == inputs.shape, name
        assert got[name].tolist() == want[name], name
