"""The bounds on what a model file may cost, as pure functions: a normalizer's worst expansion
from its description, a charsmap's from its strings, and the kind a file looks like."""

from __future__ import annotations

import os

import pytest

from input_server.data.tokenizers.checks import (
    MAX_NORMALIZER_EXPANSION,
    charsmap_expansion,
    hf_normalizer_expansion,
    looks_like,
)
from input_server.data.tokenizers.trainers import train_hf_tokenizer, write_tiktoken_model


def _replace(content: str) -> dict:
    return {"type": "Replace", "pattern": {"String": " "}, "content": content}


def test_a_sequence_multiplies_its_members_and_an_unknown_type_is_refused():
    assert hf_normalizer_expansion(None) == 1
    # A String pattern's match becomes `content`: Llama's " " -> "▁" keeps the length,
    # ALBERT's "``" -> '"' shrinks it; a Regex may match the empty string (inserts).
    assert hf_normalizer_expansion(_replace("▁")) == 1
    assert hf_normalizer_expansion(_replace("▁" * 5)) == 5
    shrink = {"type": "Replace", "pattern": {"String": "``"}, "content": '"'}
    assert hf_normalizer_expansion(shrink) == 1
    grow = {"type": "Replace", "pattern": {"String": "ab"}, "content": "xyz"}
    assert hf_normalizer_expansion(grow) == 2
    regex = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
    assert hf_normalizer_expansion(regex) == 2
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


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def test_a_sentencepiece_model_opening_with_its_normalizer_spec_is_recognized(spm_model, tmp_path):
    """Gemma 4's model opens with field 3 (`\\x1a`, its normalizer spec), not the pieces: it is
    still named a sentencepiece model (and loads as one), and a text is still not."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(open(spm_model, "rb").read())
    norm = model.normalizer_spec.SerializeToString()
    trainer = model.trainer_spec.SerializeToString()
    for tag, field in ((b"\x1a", norm), (b"\x12", trainer)):
        path = tmp_path / f"first{tag[0]}.model"
        path.write_bytes(tag + _varint(len(field)) + field + model.SerializeToString())
        assert looks_like(str(path)) == "sentencepiece"
        assert spm.SentencePieceProcessor(model_file=str(path)).vocab_size() == len(model.pieces)
    (tmp_path / "nl").write_bytes(b"\x1a\x80")  # a varint with no end
    assert looks_like(str(tmp_path / "nl")) is None
