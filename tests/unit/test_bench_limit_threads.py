"""The limit `bench` measures is tried at each thread count it names (powers of two below the
cores, and the cores): a batch call for each count, named apart, on that many threads, each
giving the tokenizer's own lengths."""

from __future__ import annotations

import pytest

from input_client.spec import TokenizerSpec
from input_server.benchmark.kinds import limit_calls, limit_threads
from input_server.data.tokenizers import load_tokenizer

# sentencepiece's one batch call: its name does not say its thread count.
CALL = "SentencePieceProcessor.encode(batch, numpy)"


@pytest.mark.parametrize(
    "cores, counts",
    [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (13, [1, 2, 4, 8, 13])],
)
def test_the_limit_is_tried_at_powers_of_two_below_the_cores_and_on_all_of_them(
    spm_model, docs, cores, counts
):
    assert limit_threads(cores) == counts
    tok = load_tokenizer(TokenizerSpec(model=spm_model))
    calls = limit_calls(tok, cores)
    # One call a count: on all the cores under the call's own name, below them named so.
    assert {name: threads for name, (threads, _) in calls.items()} == {
        CALL: cores,
        **{f"{CALL} on {n} threads": n for n in counts[:-1]},
    }
    texts = docs[:20]
    lengths = tok.encode(texts).lengths.tolist()
    for name, (_, call) in calls.items():
        assert call(texts) == lengths, name
