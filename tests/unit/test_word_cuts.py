"""A byte-level BPE `tokenizer.json` is cut before tokenizing only where `word_cuts` proves the
ids the same (a space between letters, under the split patterns it knows): trimmed documents
keep exactly the whole document's first tokens, by the reference and by a fast backend, and
any tokenizer outside the proof is tokenized whole."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.trainers import train_hf_tokenizer
from input_server.data.tokenizers.word_cuts import LLAMA3_PATTERN, QWEN_PATTERN
from tests.support.tokens import PIECES, doc_tokens


@pytest.fixture(scope="module")
def gpt2_folder(docs, tmp_path_factory) -> str:
    """ByteLevel with GPT-2's own pattern (`use_regex`), as the fixture trains it."""
    return train_hf_tokenizer(docs[:800], tmp_path_factory.mktemp("gpt2"), vocab_size=1200)


def _variant(folder: str, to: str, change) -> str:
    """A copy of the tokenizer folder with its tokenizer.json changed by `change(json)`."""
    shutil.copytree(folder, to)
    path = os.path.join(to, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    change(data)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return to


def _split(pattern: str):
    def change(data):
        data["normalizer"] = {"type": "NFC"}  # as Qwen's
        data["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        }

    return change


@pytest.fixture(scope="module", params=["gpt2", "llama3", "qwen"])
def folder(request, gpt2_folder, tmp_path_factory) -> str:
    if request.param == "gpt2":
        return gpt2_folder
    pattern = LLAMA3_PATTERN if request.param == "llama3" else QWEN_PATTERN
    to = tmp_path_factory.mktemp(request.param) / "tok"
    return _variant(gpt2_folder, str(to), _split(pattern))


def _tokenizer(folder: str, **flags):
    return load_tokenizer(TokenizerSpec(model=folder, kind="huggingface", **flags))


# `PIECES` (whitespace runs, combining marks, NFKC bait, scripts), and what the
# split patterns treat apart: contractions, digit runs, specials written as text, Arabic, emoji.
_pieces = st.one_of(
    PIECES,
    st.sampled_from(
        ["'s", "'re", "don't", "12345", "<s>", "\u0645\u0631\u062d\u0628\u0627", "\U0001f600"]
    ),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    words=st.lists(st.lists(_pieces, min_size=60, max_size=400), min_size=1, max_size=3),
    trim_to=st.integers(4, 80),
    rate=st.floats(0.2, 6.0),
    bos=st.booleans(),
    eos=st.booleans(),
)
def test_cut_documents_keep_the_whole_documents_first_tokens(
    folder, words, trim_to, rate, bos, eos
):
    tok = _tokenizer(folder, add_bos=bos, add_eos=eos)
    assert tok.cutter is not None and tok.cutter.extendable
    tok.cutter.chars_per_token = rate  # cuts, and growths, at every few spaces
    texts = ["".join(w) for w in words]
    full = tok.encode(texts)
    cut = tok.encode(texts, trim_to=trim_to)
    for i, text in enumerate(texts):
        np.testing.assert_array_equal(
            doc_tokens(cut, i), doc_tokens(full, i)[:trim_to], err_msg=repr(text[:80])
        )


def test_long_documents_are_tokenized_only_as_far_as_kept(folder, docs):
    tok = _tokenizer(folder, add_bos=True, add_eos=True)
    tok.encode(docs[:200], trim_to=64)  # learns the corpus's characters per token
    texts = [" ".join(docs[i : i + 40]) for i in range(0, 400, 40)]  # ~40 docstrings each
    full = tok.encode(texts)
    tokenized, encode = [], tok._encode
    tok._encode = lambda t, **flags: (tokenized.extend(t), encode(t, **flags))[1]
    cut = tok.encode(texts, trim_to=64)
    for i in range(len(texts)):
        np.testing.assert_array_equal(doc_tokens(cut, i), doc_tokens(full, i)[:64])
    assert sum(map(len, tokenized)) < sum(map(len, texts)) / 10  # 5,029 of 127,521 here


def test_the_fast_backend_cuts_alike(gpt2_folder, docs):
    spec = TokenizerSpec(model=gpt2_folder, kind="huggingface", add_bos=True)
    tok = load_tokenizer(spec, audit_every=0)  # what the backend alone gives
    assert tok.choose_backend(docs[:64]).backend == "fastokens"
    texts = [" ".join(docs[i : i + 30]) for i in range(0, 300, 30)]
    reference = _tokenizer(gpt2_folder, add_bos=True, backend="reference")
    want = reference.encode(texts)
    got = tok.encode(texts, trim_to=50)
    for i in range(len(texts)):
        np.testing.assert_array_equal(doc_tokens(got, i), doc_tokens(want, i)[:50])


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda d: d.update(normalizer={"type": "Lowercase"}), "a normalizer other than NFC"),
        (_split(r"\S+|\s+"), "a split pattern the proof does not cover"),
        (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "a prefix space"),
        (
            lambda d: d["added_tokens"].append(
                {
                    "id": 1199,
                    "content": "two words",
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
            ),
            "an added token holding a space",
        ),
        (lambda d: d["added_tokens"][0].update(lstrip=True), "an added token that strips"),
        (lambda d: d["model"].update(dropout=0.1), "BPE dropout"),
    ],
)
def test_tokenizers_outside_the_proof_are_tokenized_whole(gpt2_folder, tmp_path, change, why):
    tok = _tokenizer(_variant(gpt2_folder, str(tmp_path / "v"), change))
    assert tok.cutter is None, why
