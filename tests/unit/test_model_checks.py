"""The bounds on what a model file may cost, as pure functions: a normalizer's worst expansion
from its description, a charsmap's from its strings, and the kind a file looks like."""

from __future__ import annotations

import os

import pytest

from input_server.data.model_checks import (
    MAX_NORMALIZER_EXPANSION,
    charsmap_expansion,
    hf_normalizer_expansion,
    looks_like,
)
from input_server.tools.tokenizer_models import train_hf_tokenizer, write_tiktoken_model


def _replace(content: str) -> dict:
    return {"type": "Replace", "pattern": {"String": " "}, "content": content}


def test_a_sequence_multiplies_its_members_and_an_unknown_type_is_refused():
    assert hf_normalizer_expansion(None) == 1
    assert hf_normalizer_expansion(_replace("▁")) == 2
    assert hf_normalizer_expansion({"type": "Sequence", "normalizers": [{"type": "NFKC"}]}) == 18
    chain = {"type": "Sequence", "normalizers": [_replace("  ")] * 12}
    assert hf_normalizer_expansion(chain) > MAX_NORMALIZER_EXPANSION
    with pytest.raises(ValueError, match="unknown type 'Shout'"):
        hf_normalizer_expansion({"type": "Shout"})


def test_a_charsmap_expands_as_its_longest_string(spm_model):
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(open(spm_model, "rb").read())
    # sentencepiece's default nmt_nfkc: U+FDFA's 18 characters are the longest.
    assert charsmap_expansion(model.normalizer_spec.precompiled_charsmap) == 18
    trie = b"\0" * 8
    blob = len(trie).to_bytes(4, "little") + trie + b"ab\0" + b"N" * 3000 + b"\0"
    assert charsmap_expansion(blob) == 3000
    assert charsmap_expansion(b"") == 1


def test_each_kind_of_model_file_is_recognized(spm_model, docs, tmp_path):
    hf = train_hf_tokenizer(docs[:100], tmp_path / "hf", vocab_size=300)
    ranks = write_tiktoken_model(docs[:100], tmp_path / "m.tiktoken", vocab_size=300)
    assert looks_like(spm_model) == "sentencepiece"
    assert looks_like(os.path.join(hf, "tokenizer.json")) == "huggingface"
    assert looks_like(ranks) == "tiktoken"
    (tmp_path / "text").write_text("hello world\n")
    assert looks_like(str(tmp_path / "text")) is None
    assert looks_like(str(tmp_path / "missing")) is None
