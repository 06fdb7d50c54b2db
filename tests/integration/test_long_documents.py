"""`batch.long_documents` through the real server: a state taken inside a chunked document
resumes exactly there (first_fit and none now stop inside documents, at a chunk's end), forged
offsets are refused naming the way out, and each policy keeps the tokens it promises (trim:
each document's first seq_len, with every packing; chunk and split: all of them)."""

from __future__ import annotations

import grpc
import pytest

from input_client import InputClient, StreamError
from tests.support import TOKENS, assert_same_batches, run_pipeline

SEQ = 32


def _spec(make_spec, packing: str, long_documents: str):
    return make_spec(
        batch={"seq_len": SEQ, "size": 4, "packing": packing, "long_documents": long_documents},
        order={"epochs": 1},
    )


def _stream(target: str, spec, state=None) -> tuple[list, list[dict]]:
    """Every batch of the (rest of the) pass, and the state after each."""
    batches, states = [], []
    with (
        InputClient(target, token=TOKENS.get(target)) as c,
        c.batches(spec, state=state) as it,
    ):
        for b in it:
            batches.append(b)
            states.append(it.get_state())
    return batches, states


@pytest.mark.parametrize("packing", ["first_fit", "none"])
def test_a_state_inside_a_chunked_document_resumes_exactly_there(target, make_spec, packing):
    spec = _spec(make_spec, packing, "chunk")
    full, states = _stream(target, spec)
    assert_same_batches(full, run_pipeline(spec))  # served as the pipeline makes them
    inside = [i for i, s in enumerate(states) if s["offset"] > 0]
    assert len(inside) > 5, "no batch ended inside a document: nothing is tested"
    assert all(s["offset"] % SEQ == 0 for s in states)  # only where a chunk ends
    for i in (inside[0], inside[len(inside) // 2], inside[-1]):
        rest, rest_states = _stream(target, spec, state=states[i])
        assert_same_batches(rest, full[i + 1 :])
        assert rest_states == states[i + 1 :]


def test_forged_offsets_in_a_chunked_stream_are_refused_clearly(make_spec, server):
    spec = _spec(make_spec, "first_fit", "chunk")
    _, states = _stream(server.targets[0], spec)
    honest = next(s for s in states if s["offset"] > 0)
    for offset, says in (
        (honest["offset"] + 1, f"`offset` is a multiple of `batch.seq_len` {SEQ}"),
        (honest["offset"] + 1000 * SEQ, f"offset {honest['offset'] + 1000 * SEQ} is past the"),
    ):
        with pytest.raises(StreamError) as e:
            _stream(server.targets[0], spec, state={**honest, "offset": offset})
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value.details
        assert says in e.value.details and "resume_state" in e.value.details
    # Under trim the same packing never stops inside a document.
    trim = _spec(make_spec, "first_fit", "trim")
    forged = {**honest, "fingerprint": trim.data_fingerprint()}
    with pytest.raises(StreamError, match="its `offset` is 0"):
        _stream(server.targets[0], trim, state=forged)


@pytest.mark.parametrize(
    "packing, long_documents",
    [
        ("first_fit", "trim"),
        ("first_fit", "chunk"),
        ("none", "chunk"),
        ("concat_then_split", "trim"),
        ("concat_then_split", "chunk"),
        ("concat_then_split", "split"),
    ],
)
def test_each_policy_keeps_the_tokens_it_promises(
    make_spec, docs, spm_model, packing, long_documents
):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    lengths = [len(ids) + 2 for ids in sp.encode(docs)]  # with BOS and EOS
    assert sum(n > SEQ for n in lengths) > 100  # many documents are long
    spec = _spec(make_spec, packing, long_documents)
    kept = sum(b.num_tokens for b in run_pipeline(spec))
    if long_documents == "trim":
        assert kept == sum(min(n, SEQ) for n in lengths)
    else:  # every token, BOS and EOS included, in pieces or split across rows
        assert kept == sum(lengths)
