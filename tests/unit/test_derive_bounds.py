"""Deriving a fastokens tokenizer.json from tiktoken ranks is pure Python with the GIL held: its
work is bounded before it starts, and the texts kept per process are bounded in characters."""

from __future__ import annotations

import time

import pytest

from input_server.data.tokenizers import fast
from input_server.data.tokenizers.tiktoken import PATTERN
from input_server.errors import InvalidSpecError


def test_ranks_past_the_work_bound_are_refused_before_any_work():
    # Random long tokens: each split is looked up, none merges (7.4 s for 16 MB before).
    import random

    rng = random.Random(0)
    ranks = {bytes([b]): b for b in range(256)}
    while sum(map(len, ranks)) <= fast.MAX_DERIVE_WORK:
        ranks[rng.randbytes(760)] = len(ranks)
    started = time.process_time()
    with pytest.raises(InvalidSpecError, match=r"'crafted\.tiktoken'.*MAX_DERIVE_WORK"):
        fast.ranks_as_tokenizer_json(ranks, PATTERN, "crafted.tiktoken")
    assert time.process_time() - started < 0.5


def test_derived_texts_kept_are_bounded_in_characters(tmp_path, monkeypatch):
    monkeypatch.setattr(fast, "_DERIVED", type(fast._DERIVED)())
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abc": 257}
    one = len(fast.ranks_as_tokenizer_json(ranks, PATTERN, "x"))
    monkeypatch.setattr(fast, "MAX_DERIVED_CHARS", int(1.5 * one))  # room for one, not two
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.tiktoken"
        path.write_text(name)
        paths.append(str(path))
        assert fast.derived_json(str(path), lambda: ranks, PATTERN, name)
    kept = [key[0] for key in fast._DERIVED]
    assert kept == [paths[1]]  # the newest, alone
