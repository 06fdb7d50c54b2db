"""The tokenizer.json derived from tiktoken ranks keeps one merge a token where tiktoken's last
join is known (`fast._last_pair`): fastokens loads it with tiktoken's ids on every short string,
whatever order the ranks give a token and its parts."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from input_server.data.tokenizers import fast
from input_server.data.tokenizers.tiktoken import PATTERN


def _ranks(seed: int) -> dict[bytes, int]:
    """The 256 bytes, then 40 random words of 2 to 5 letters of "abc" in a random order: parts
    may rank above the token they make, and some tokens no join makes (as in Llama 3's)."""
    rng = random.Random(seed)
    words = {
        "".join(rng.choice("abc") for _ in range(rng.randint(2, 5))).encode() for _ in range(40)
    }
    ranks = {bytes([b]): b for b in range(256)}
    for w in rng.sample(sorted(words), len(words)):
        ranks[w] = len(ranks)
    return ranks


@pytest.mark.parametrize("seed", range(12))
def test_the_derived_json_gives_tiktokens_ids_on_every_short_string(seed):
    import fastokens
    import tiktoken

    ranks = _ranks(seed)
    derived = fast.ranks_as_tokenizer_json(ranks, PATTERN, "x")
    enc = tiktoken.Encoding(name="t", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})
    tok = fastokens.Tokenizer.from_json_str(derived)
    texts = ["".join(p) for n in range(1, 8) for p in itertools.product("abc", repeat=n)]
    ids, offsets = tok.encode_batch_flat(texts, add_special_tokens=False)
    ids, offsets = np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64)
    for i, text in enumerate(texts):
        assert ids[offsets[i] : offsets[i + 1]].tolist() == enc.encode_ordinary(text), text
    # One merge a token at most (the pair tiktoken joins last), where every cut into two
    # tokens would make more.
    cuts = [sum(t[:c] in ranks and t[c:] in ranks for c in range(1, len(t))) for t in ranks]
    assert max(cuts) > 1  # the ranks do hold tokens with several cuts
    assert len(json.loads(derived)["model"]["merges"]) < sum(cuts)
