"""Packing: MaxText's batch layout and each packing mode's promises, on generated documents;
long documents trimmed or chunked under each packing, and resuming from any position."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from input_client.wire import FIELDS
from input_server.batching.pack import DocCursor, pack_batch
from input_server.batching.resume import parse_state
from input_server.data.tokenizers import TokenGroup
from input_server.errors import InvalidSpecError

docs_strategy = st.lists(
    st.lists(st.integers(1, 999), min_size=0, max_size=40), min_size=1, max_size=40
)


def groups_of(docs: list[list[int]], group_size: int = 4):
    for first in range(0, len(docs), group_size):
        part = docs[first : first + group_size]
        yield TokenGroup(
            first_doc=first,
            tokens=np.array([t for d in part for t in d], np.int32),
            lengths=np.array([len(d) for d in part], np.int64),
        )


def pack_all(docs, *, size, seq_len, packing, long_documents=None, group_size=4):
    cursor = DocCursor(groups_of(docs, group_size), long_documents=long_documents, seq_len=seq_len)
    batches = []
    while (b := pack_batch(cursor, size=size, seq_len=seq_len, packing=packing)) is not None:
        batches.append(b.arrays())
    return batches


def segments(batch):
    """Each row's segments as token lists, with their positions."""
    out = []
    for r in range(batch["inputs"].shape[0]):
        seg, inp = batch["inputs_segmentation"][r], batch["inputs"][r]
        pos = batch["inputs_position"][r]
        for s in range(1, int(seg.max(initial=0)) + 1):
            mask = seg == s
            out.append((inp[mask].tolist(), pos[mask].tolist()))
    return out


def check_layout(batch, size, seq_len):
    """MaxText's meaning of the six arrays."""
    assert set(batch) == set(FIELDS)
    for a in batch.values():
        assert a.dtype == np.int32 and a.shape == (size, seq_len)
    inp, seg, pos = batch["inputs"], batch["inputs_segmentation"], batch["inputs_position"]
    np.testing.assert_array_equal(batch["targets"][:, :-1], inp[:, 1:])
    np.testing.assert_array_equal(batch["targets_segmentation"][:, :-1], seg[:, 1:])
    np.testing.assert_array_equal(batch["targets_position"][:, :-1], pos[:, 1:])
    for name in ("targets", "targets_segmentation", "targets_position"):
        assert (batch[name][:, -1] == 0).all()
    assert (inp[seg == 0] == 0).all() and (pos[seg == 0] == 0).all()
    assert (batch["targets"][batch["targets_segmentation"] == 0] == 0).all()
    for r in range(size):
        used = np.flatnonzero(seg[r])
        if len(used):  # segments are contiguous, numbered 1, 2, ... from the row's start
            assert used[0] == 0 and (np.diff(used) == 1).all()
            assert (np.diff(seg[r][used]) >= 0).all()
            assert set(seg[r][used]) == set(range(1, seg[r].max() + 1))


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, size=st.integers(1, 4), seq_len=st.integers(2, 24))
def test_first_fit_keeps_order_trims_and_fits(docs, size, seq_len):
    batches = pack_all(docs, size=size, seq_len=seq_len, packing="first_fit")
    placed = []
    for b in batches:
        check_layout(b, size, seq_len)
        placed.extend(segments(b))
    nonempty = [d[:seq_len] for d in docs if d]
    # Every non-empty document is there once, trimmed, positions counting from 0.
    assert sorted(map(tuple, (t for t, _ in placed))) == sorted(map(tuple, nonempty))
    assert all(p == list(range(len(t))) for t, p in placed)
    # Real-token count equals the trimmed documents' tokens: nothing padded is counted.
    assert sum(len(d) for d in nonempty) == sum(
        int((b["inputs_segmentation"] > 0).sum()) for b in batches
    )


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, size=st.integers(1, 4), seq_len=st.integers(2, 24))
def test_concat_then_split_loses_no_token(docs, size, seq_len):
    batches = pack_all(docs, size=size, seq_len=seq_len, packing="concat_then_split")
    stream = []
    for b in batches:
        check_layout(b, size, seq_len)
        rows = b["inputs"][b["inputs_segmentation"] > 0]
        stream.extend(rows.tolist())
    assert stream == [t for d in docs for t in d]
    for b in batches[:-1]:  # every batch but the last is full
        assert (b["inputs_segmentation"] > 0).all()


@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, size=st.integers(1, 4), seq_len=st.integers(2, 24))
def test_none_is_one_document_per_row(docs, size, seq_len):
    batches = pack_all(docs, size=size, seq_len=seq_len, packing="none")
    rows = []
    for b in batches:
        check_layout(b, size, seq_len)
        for r in range(size):
            n = int((b["inputs_segmentation"][r] > 0).sum())
            rows.append(b["inputs"][r][:n].tolist())
    assert rows[: len(docs)] == [d[:seq_len] for d in docs]
    assert all(r == [] for r in rows[len(docs) :])  # the last batch's spare rows are padding


def test_first_fit_fills_rows_before_opening_a_batch():
    docs = [[5] * 6, [6] * 3, [7] * 4, [8] * 2, [9] * 7]
    (b, b2) = pack_all(docs, size=2, seq_len=8, packing="first_fit")
    # 6 -> row 0; 3 -> row 1; 4 -> row 1 (3+4 <= 8); 2 -> row 0 (6+2); 7 fits nowhere -> next batch.
    assert b["inputs"][0].tolist() == [5] * 6 + [8] * 2
    assert b["inputs"][1].tolist() == [6] * 3 + [7] * 4 + [0]
    assert b["inputs_segmentation"][1].tolist() == [1, 1, 1, 2, 2, 2, 2, 0]
    assert b["inputs_position"][1].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert b2["inputs"][0].tolist() == [9] * 7 + [0]


@pytest.mark.parametrize("packing", ["first_fit", "concat_then_split", "none"])
def test_resuming_from_any_cursor_position_continues_exactly(packing):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 50, rng.integers(0, 30)).tolist() for _ in range(60)]
    full = pack_all(docs, size=3, seq_len=16, packing=packing)
    cursor = DocCursor(groups_of(docs))
    for i in range(len(full)):
        pack_batch(cursor, size=3, seq_len=16, packing=packing)
        # A fresh cursor started at the saved position, on groups from the one holding it.
        doc, offset = cursor.at()
        g = (doc // 4) * 4
        resumed = DocCursor(groups_of(docs[g:], 4), doc - g, offset)
        rest = []
        while (b := pack_batch(resumed, size=3, seq_len=16, packing=packing)) is not None:
            rest.append(b.arrays())
        assert len(rest) == len(full) - i - 1
        for x, y in zip(rest, full[i + 1 :], strict=True):
            for k in FIELDS:
                np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize(
    "vocab_size, wire_dtype",
    [(1000, np.uint16), (65536, np.uint16), (65537, np.int32), (256_000, np.int32)],
)
def test_wire_form_narrows_ids_only_when_the_vocabulary_fits_uint16(vocab_size, wire_dtype):
    from input_client.wire import expand_packed

    top = vocab_size - 1
    docs = [[top, 1, 2], [top] * 5, [3, top]]
    cursor = DocCursor(groups_of(docs))
    batch = pack_batch(cursor, size=2, seq_len=8, packing="first_fit")
    wire = batch.compact(vocab_size)
    assert wire["inputs"].dtype == wire_dtype
    got = expand_packed(**wire)
    check_layout(got, 2, 8)  # widened back: all six int32
    for k, want in batch.arrays().items():
        np.testing.assert_array_equal(got[k], want)
    assert int(got["inputs"].max()) == top


def _reference_first_fit(lengths: list[int], size: int, seq_len: int) -> list[list[list[int]]]:
    """First fit as its definition reads: each document (trimmed) into the first row with
    room; a document no row fits opens the next batch. Rows as lists of document indices."""
    batches, free, rows = [], [seq_len] * size, [[] for _ in range(size)]
    for d, n in enumerate(lengths):
        n = min(n, seq_len)
        if n == 0:
            continue
        fit = next((r for r in range(size) if free[r] >= n), None)
        if fit is None:
            batches.append(rows)
            free, rows = [seq_len] * size, [[] for _ in range(size)]
            fit = 0
        rows[fit].append(d)
        free[fit] -= n
    if any(rows):
        batches.append(rows)
    return batches


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), max_size=120),
    size=st.integers(1, 5),
    seq_len=st.integers(2, 24),
)
def test_first_fit_places_each_document_where_its_definition_says(lengths, size, seq_len):
    # Document d's tokens are all d + 1, so every segment names its document.
    docs = [[d + 1] * n for d, n in enumerate(lengths)]
    got = [
        [[int(b["inputs"][r][s]) - 1 for s in _segment_starts(b, r)] for r in range(size)]
        for b in pack_all(docs, size=size, seq_len=seq_len, packing="first_fit")
    ]
    assert got == _reference_first_fit(lengths, size, seq_len)


def _segment_starts(batch, row: int) -> list[int]:
    seg = batch["inputs_segmentation"][row]
    return [i for i in range(len(seg)) if seg[i] and (i == 0 or seg[i] != seg[i - 1])]


# Long documents: the pieces MaxText's TokenizeAndTrim / TokenizeAndChunk make of the token
# ids (BOS/EOS included), each then packed as a document of its own.
LONG = [(p, d) for p in ("first_fit", "concat_then_split", "none") for d in ("trim", "chunk")]


def pieces_of(docs, long_documents, seq_len):
    if long_documents == "trim":
        return [d[:seq_len] for d in docs]
    if long_documents == "chunk":  # an empty document has no chunk (TokenizeAndChunk: [])
        return [d[k : k + seq_len] for d in docs for k in range(0, len(d), seq_len)]
    return docs


@pytest.mark.parametrize("packing, long_documents", LONG)
@settings(max_examples=40, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(1, 999), max_size=60), min_size=1, max_size=30),
    size=st.integers(1, 4),
    seq_len=st.integers(2, 12),
    group_size=st.integers(1, 5),
)
def test_long_documents_pack_as_their_pieces_would(
    packing, long_documents, docs, size, seq_len, group_size
):
    got = pack_all(
        docs,
        size=size,
        seq_len=seq_len,
        packing=packing,
        long_documents=long_documents,
        group_size=group_size,
    )
    pieces = pieces_of(docs, long_documents, seq_len)
    want = pack_all(pieces, size=size, seq_len=seq_len, packing=packing, group_size=group_size)
    assert len(got) == len(want)
    for x, y in zip(got, want, strict=True):
        check_layout(x, size, seq_len)
        for k in FIELDS:
            np.testing.assert_array_equal(x[k], y[k])


def _tokens(d: int, n: int) -> list[int]:
    """Document d's n tokens name it and their place: 100 * (d + 1) + j."""
    return [100 * (d + 1) + j for j in range(n)]


def _rows(batches) -> list[list[list[tuple[int, int, int]]]]:
    """Per batch, per row, each segment as (document, first token, end) of its tokens."""
    out = []
    for b in batches:
        rows = []
        for r in range(b["inputs"].shape[0]):
            seg, inp, pos = b["inputs_segmentation"][r], b["inputs"][r], b["inputs_position"][r]
            row = []
            for s in range(1, int(seg.max(initial=0)) + 1):
                t, p = inp[seg == s].tolist(), pos[seg == s].tolist()
                assert p == list(range(len(t)))  # positions restart at every segment
                assert t == list(range(t[0], t[0] + len(t)))  # consecutive tokens of one doc
                row.append((t[0] // 100 - 1, t[0] % 100, t[-1] % 100 + 1))
            rows.append(row)
        out.append(rows)
    return out


# An empty document, one of exactly seq_len (4), of 2 * seq_len, of 10 (a last chunk of 2),
# a short one.
EDGES = [_tokens(d, n) for d, n in enumerate([0, 4, 8, 10, 3])]
EDGE_ROWS = {
    ("first_fit", "chunk"): [
        [[(1, 0, 4)], [(2, 0, 4)]],  # 2's second chunk fits no row: it opens the next batch
        [[(2, 4, 8)], [(3, 0, 4)]],
        [[(3, 4, 8)], [(3, 8, 10)]],
        [[(4, 0, 3)], []],
    ],
    ("first_fit", "trim"): [[[(1, 0, 4)], [(2, 0, 4)]], [[(3, 0, 4)], [(4, 0, 3)]]],
    ("concat_then_split", "chunk"): [
        [[(1, 0, 4)], [(2, 0, 4)]],
        [[(2, 4, 8)], [(3, 0, 4)]],
        [[(3, 4, 8)], [(3, 8, 10), (4, 0, 2)]],
        [[(4, 2, 3)], []],
    ],
    ("concat_then_split", "trim"): [
        [[(1, 0, 4)], [(2, 0, 4)]],
        [[(3, 0, 4)], [(4, 0, 3)]],
    ],
    ("none", "chunk"): [  # the empty document has no chunk, so no row
        [[(1, 0, 4)], [(2, 0, 4)]],
        [[(2, 4, 8)], [(3, 0, 4)]],
        [[(3, 4, 8)], [(3, 8, 10)]],
        [[(4, 0, 3)], []],
    ],
    ("none", "trim"): [[[], [(1, 0, 4)]], [[(2, 0, 4)], [(3, 0, 4)]], [[(4, 0, 3)], []]],
}


@pytest.mark.parametrize("packing, long_documents", LONG)
def test_chunks_and_trims_of_edge_lengths(packing, long_documents):
    got = pack_all(
        EDGES, size=2, seq_len=4, packing=packing, long_documents=long_documents, group_size=2
    )
    assert _rows(got) == EDGE_ROWS[packing, long_documents]


def test_concat_then_split_starts_a_segment_at_a_chunk_boundary_not_at_a_split():
    docs = [_tokens(0, 3), _tokens(1, 8)]
    rows = {
        d: _rows(pack_all(docs, size=3, seq_len=4, packing="concat_then_split", long_documents=d))
        for d in ("split", "chunk", "trim")
    }
    assert rows["split"] == [[[(0, 0, 3), (1, 0, 1)], [(1, 1, 5)], [(1, 5, 8)]]]
    assert rows["chunk"] == [[[(0, 0, 3), (1, 0, 1)], [(1, 1, 4), (1, 4, 5)], [(1, 5, 8)]]]
    assert rows["trim"] == [[[(0, 0, 3), (1, 0, 1)], [(1, 1, 4)], []]]


@pytest.mark.parametrize("packing, long_documents", [*LONG, ("concat_then_split", "split")])
def test_resuming_long_documents_from_any_position_continues_exactly(packing, long_documents):
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 50, rng.integers(0, 50)).tolist() for _ in range(60)]
    kw = dict(size=3, seq_len=16, packing=packing)
    full = pack_all(docs, **kw, long_documents=long_documents)
    cursor = DocCursor(groups_of(docs), long_documents=long_documents, seq_len=16)
    offsets = []
    for i in range(len(full)):
        pack_batch(cursor, **kw)
        doc, offset = cursor.at()
        offsets.append(offset)
        g = (doc // 4) * 4  # a fresh cursor at the position, on groups from the one holding it
        resumed = DocCursor(
            groups_of(docs[g:]), doc - g, offset, long_documents=long_documents, seq_len=16
        )
        rest = []
        while (b := pack_batch(resumed, **kw)) is not None:
            rest.append(b.arrays())
        assert len(rest) == len(full) - i - 1
        for x, y in zip(rest, full[i + 1 :], strict=True):
            for k in FIELDS:
                np.testing.assert_array_equal(x[k], y[k])
    if long_documents == "chunk" or packing == "concat_then_split":
        assert any(offsets)  # some batch ended inside a document
    if packing != "concat_then_split":  # only at a piece's start
        assert all(o % 16 == 0 for o in offsets) and (any(offsets) == (long_documents == "chunk"))


def test_an_offset_past_a_chunked_document_is_refused():
    docs = [_tokens(0, 10), _tokens(1, 3)]
    cursor = DocCursor(groups_of(docs), 0, 8, long_documents="chunk", seq_len=4)
    assert _rows([pack_batch(cursor, size=1, seq_len=4, packing="first_fit").arrays()]) == [
        [[(0, 8, 10)]]
    ]
    for offset in (10, 12):
        cursor = DocCursor(groups_of(docs), 0, offset, long_documents="chunk", seq_len=4)
        with pytest.raises(InvalidSpecError, match=f"offset {offset} is past the 10 tokens"):
            pack_batch(cursor, size=1, seq_len=4, packing="first_fit")


def test_a_resume_offset_inside_a_chunk_is_refused_where_no_piece_is_split():
    def parse(offset, **kw):
        state = {"version": 1, "fingerprint": "f", "seq": 3, "doc": 2, "offset": offset}
        return parse_state(state, fingerprint="f", num_docs=9, **kw)

    assert parse(32, splits_documents=False, chunk_len=16).offset == 32
    with pytest.raises(InvalidSpecError, match="a multiple of `batch.seq_len` 16"):
        parse(20, splits_documents=False, chunk_len=16)
    with pytest.raises(InvalidSpecError, match="its `offset` is 0"):
        parse(32, splits_documents=False)
    assert parse(20, splits_documents=True, chunk_len=16).offset == 20  # concat_then_split
