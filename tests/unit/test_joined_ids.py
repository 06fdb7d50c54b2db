"""A group of pre-tokenized documents joined as text would give them (`data.ids.joined_ids`):
BOS, the ids, EOS, each document trimmed; ids outside the vocabulary refused by record and
position. Checked against the plain per-document reading of that rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from input_server.data.ids import joined_ids
from input_server.data.tokenizers import Specials
from input_server.errors import RecordError

VOCAB = 1000


def _specials(bos, eos) -> Specials:
    return Specials(vocab_size=VOCAB, bos=bos, eos=eos, written="the test's vocabulary")


def _one_by_one(docs, specials, trim_to) -> tuple[list[int], list[int]]:
    tokens, lengths = [], []
    for d in docs:
        doc = [specials.bos] * (specials.bos is not None) + d.tolist()
        doc += [specials.eos] * (specials.eos is not None)
        doc = doc if trim_to is None else doc[:trim_to]
        tokens += doc
        lengths.append(len(doc))
    return tokens, lengths


docs_st = st.lists(st.lists(st.integers(0, VOCAB - 1), max_size=12), max_size=8)


@settings(max_examples=400, deadline=None)
@given(
    docs_st,
    st.sampled_from([np.int32, np.int64]),
    st.sampled_from([None, 998]),
    st.sampled_from([None, 999]),
    st.one_of(st.none(), st.integers(0, 14)),
)
def test_joined_as_each_document_alone(docs, dtype, bos, eos, trim_to):
    arrays = [np.asarray(d, dtype) for d in docs]
    specials = _specials(bos, eos)
    tokens, lengths = joined_ids(arrays, specials, trim_to=trim_to, where=str)
    want_tokens, want_lengths = _one_by_one(arrays, specials, trim_to)
    assert tokens.dtype == np.int32 and tokens.tolist() == want_tokens
    assert lengths.tolist() == want_lengths


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bad", [VOCAB, -1])
def test_an_id_outside_the_vocabulary_is_refused_by_record_and_position(dtype, bad):
    docs = [np.asarray([1, 2], dtype), np.asarray([3, 4, bad, 5], dtype)]
    with pytest.raises(RecordError, match=rf"^record 1: token id {bad} \(position 2\) is outside"):
        joined_ids(docs, _specials(998, 999), trim_to=None, where=lambda i: f"record {i}")


def test_an_int64_id_past_int32_is_refused_not_wrapped():
    docs = [np.asarray([7, 2**32 + 5], np.int64)]
    with pytest.raises(RecordError, match=rf"token id {2**32 + 5} \(position 1\)"):
        joined_ids(docs, _specials(None, None), trim_to=None, where=lambda i: f"record {i}")
