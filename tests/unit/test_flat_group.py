"""`flat_group` (a fast backend's one flat buffer a group) makes the group `group_of` makes
from per-document arrays: the same tokens, lengths and dtypes, BOS/EOS added and trimmed alike."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from input_server.data.tokenizers.groups import TokenGroup, flat_group, group_of

# Ids as a backend gives them: below 2**31, so that uint32 and int32 agree.
ids = st.integers(min_value=0, max_value=(1 << 31) - 1)
docs = st.lists(st.lists(ids, max_size=24), max_size=10)
ends = st.lists(ids, max_size=2)
trims = st.none() | st.integers(min_value=1, max_value=30)


def _flat(documents: list[list[int]], dtype, before: int = 0, after: int = 0):
    """The documents' ids in one buffer, `before` and `after` stray ids around them (a
    backend's buffer need not start at the group), and the n + 1 offsets into it."""
    lengths = [len(d) for d in documents]
    flat = np.array([7] * before + [i for d in documents for i in d] + [9] * after, dtype)
    offsets = before + np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    return flat, offsets.astype(np.int64)


def _reference(documents, head, tail, first_doc, trim_to) -> TokenGroup:
    return group_of(
        [np.asarray([*head, *d, *tail], np.int32) for d in documents], first_doc, trim_to
    )


def _assert_same(got: TokenGroup, want: TokenGroup) -> None:
    assert got.first_doc == want.first_doc
    assert got.tokens.dtype == np.int32 and got.lengths.dtype == np.int64
    assert got.lengths.tolist() == want.lengths.tolist()
    assert got.tokens.tolist() == want.tokens.tolist()
    assert not got.audited and not got.mismatched


@settings(max_examples=300, deadline=None)
@given(
    documents=docs,
    head=ends,
    tail=ends,
    trim_to=trims,
    first_doc=st.integers(0, 1 << 40),
    dtype=st.sampled_from([np.uint32, np.int32]),
    before=st.integers(0, 3),
    after=st.integers(0, 3),
)
def test_flat_group_is_group_of(documents, head, tail, trim_to, first_doc, dtype, before, after):
    flat, offsets = _flat(documents, dtype, before, after)
    kept = flat.copy()
    got = flat_group(flat, offsets, head, tail, first_doc, trim_to)
    _assert_same(got, _reference(documents, head, tail, first_doc, trim_to))
    assert np.array_equal(flat, kept)  # the backend's buffer is read, never written


@given(head=ends, tail=ends, trim_to=trims, dtype=st.sampled_from([np.uint32, np.int32]))
def test_an_empty_group_is_empty(head, tail, trim_to, dtype):
    """No documents (offsets [0]), or only empty ones: no tokens, or just the ends."""
    flat, offsets = _flat([], dtype)
    _assert_same(
        flat_group(flat, offsets, head, tail, 5, trim_to), _reference([], head, tail, 5, trim_to)
    )
    flat, offsets = _flat([[], [], []], dtype)
    _assert_same(
        flat_group(flat, offsets, head, tail, 5, trim_to),
        _reference([[], [], []], head, tail, 5, trim_to),
    )


def test_uint32_ids_keep_their_bits():
    """A backend's uint32 buffer is read as int32 (its bits), as the reference's ids are."""
    flat = np.array([0, 1, (1 << 31) - 1, 5], np.uint32)
    group = flat_group(flat, np.array([0, 3, 4]), [100], [101], 0, None)
    assert group.tokens.tolist() == [100, 0, 1, (1 << 31) - 1, 101, 100, 5, 101]
    assert group.lengths.tolist() == [5, 3]
    trimmed = flat_group(flat, np.array([0, 3, 4]), [100], [101], 0, 2)
    assert trimmed.tokens.tolist() == [100, 0, 100, 5] and trimmed.lengths.tolist() == [2, 2]
