"""tiktoken's pieces (what MaxText hands tiktoken for a document) found without stepping through
every character: the cheap check never misses a run MaxText would split, so `pieces` equals
MaxText's own loop (`split_runs` over 400,000-character chunks), at small sizes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from input_server.data.tokenizers import tiktoken as tk

TEXT = st.text(alphabet=[" ", "\n", "\t", "\u3000", "a", "b", "é"], max_size=60)


@settings(max_examples=400, deadline=None)
@given(text=TEXT, run=st.integers(1, 9))
def test_the_cheap_check_never_misses_a_long_run(text, run):
    long_run = re.compile(rf"\s{{{run + 1}}}|\S{{{run + 1}}}")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tk, "MAX_RUN", run)
        if long_run.search(text):
            assert tk._may_run_long(text)
        if len(text) <= run:
            assert not tk._may_run_long(text)


@settings(max_examples=400, deadline=None)
@given(text=TEXT, run=st.integers(1, 9), chunk=st.integers(5, 30))
def test_pieces_are_maxtexts(text, run, chunk):
    maxtext = [
        p for i in range(0, len(text), chunk) for p in tk.split_runs(text[i : i + chunk], run)
    ] or [""]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tk, "MAX_RUN", run)
        m.setattr(tk, "MAX_ENCODE_CHARS", chunk)
        m.setattr(tk, "_LONG_RUN", re.compile(rf"\s{{{run + 1}}}|\S{{{run + 1}}}"))
        got = tk.pieces(text)
    assert got == maxtext, (text, got, maxtext)
