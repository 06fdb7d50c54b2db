"""Real normalizer chains load, hostile ones are still refused (issue 27, H11).

The static bound multiplies each member's worst case, which refused ALBERT's real chain
(NFKD 18 x Lowercase 3 x nmt_nfkc 18 x ...); a product past MAX_NORMALIZER_EXPANSION is now
measured on the loaded normalizer. The chains below are the real models' `tokenizer.json`
normalizers, written out here (no downloads) with sentencepiece's default nmt_nfkc charsmap
taken from a model trained by the fixture, on a tiny model of the project's trained one.
"""

from __future__ import annotations

import base64
import json
import shutil
import time

import pytest

from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.checks import MAX_NORMALIZER_EXPANSION
from input_server.data.tokenizers.trainers import train_hf_tokenizer
from input_server.errors import InvalidSpecError


def _replace(pattern: dict, content: str) -> dict:
    return {"type": "Replace", "pattern": pattern, "content": content}


def _chains(charsmap: str) -> dict[str, dict]:
    pre = {"type": "Precompiled", "precompiled_charsmap": charsmap}
    spaces = _replace({"Regex": " {2,}"}, " ")
    quotes = [_replace({"String": "``"}, '"'), _replace({"String": "''"}, '"')]
    accents = [{"type": "NFKD"}, {"type": "StripAccents"}]
    return {
        # transformers' AlbertConverter: quotes, NFKD, StripAccents, Lowercase, the charsmap,
        # runs of spaces (static product 1,944: was refused).
        "albert": [*quotes, *accents, {"type": "Lowercase"}, pre, spaces],
        "xlnet": [*quotes, *accents, pre, spaces],  # XLNetConverter: ALBERT without Lowercase
        "t5": [pre, spaces],
        "deberta-v3": [pre, spaces, {"type": "Lowercase"}],
    }


@pytest.fixture(scope="module")
def made(docs, spm_model, tmp_path_factory):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(open(spm_model, "rb").read())
    charsmap = base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode()
    d = tmp_path_factory.mktemp("normalizers")
    return train_hf_tokenizer(docs[:100], d / "hf", vocab_size=300), charsmap, d


def _with(made, name: str, members) -> str:
    base, _, d = made
    folder = shutil.copytree(base, d / name)
    path = folder / "tokenizer.json"
    model = json.loads(path.read_text())
    model["normalizer"] = {"type": "Sequence", "normalizers": members}
    path.write_text(json.dumps(model))
    return str(folder)


@pytest.mark.parametrize("name", ["albert", "xlnet", "t5", "deberta-v3"])
def test_real_normalizer_chains_load(made, name):
    folder = _with(made, name, _chains(made[1])[name])
    started = time.monotonic()
    tok = load_tokenizer(TokenizerSpec(model=folder, kind="huggingface"))
    took = time.monotonic() - started
    assert len(tok.encode(["Return  the ``number'' of Ítems."]).tokens) > 3
    print(f"{name}: loaded and measured in {took:.2f} s")


def _refused(made, name, members, needle):
    folder = _with(made, name, members)
    with pytest.raises(InvalidSpecError) as e:
        load_tokenizer(TokenizerSpec(model=folder, kind="huggingface")).encode(["a b"])
    text = str(e.value)
    assert "MAX_NORMALIZER_EXPANSION" in text and folder in text and needle in text, text


def test_hostile_chains_are_still_refused(made):
    charsmap = made[1]
    double = _replace({"String": " "}, "  ")
    # Each link doubles a space: the measured 4,096 is refused, not the static product alone.
    _refused(made, "doubling", [double] * 12, "up to 4096 characters")
    # One member past the limit is refused without measuring.
    _refused(made, "one", [_replace({"String": " "}, "x" * 2000)], "up to 2000 characters")
    # A Regex making 200 "\ufdfa" of a space (U+FDFA: 18 characters under NFKC): each member
    # within the limit, the measured 3,600 past it.
    grow = _replace({"Regex": " "}, "\ufdfa" * 200)
    _refused(made, "regex", [grow, {"type": "NFKC"}], "(measured)")
    # A chain whose product no measurement is worth: refused statically.
    pre = {"type": "Precompiled", "precompiled_charsmap": charsmap}
    _refused(made, "product", [double] * 17 + [pre], "members' product")
    assert MAX_NORMALIZER_EXPANSION == 256


def test_a_hostile_member_of_the_far_planes_is_probed(made, docs, tmp_path):
    """Planes 4-16 (unassigned, private use) are probed only when a member could touch them:
    a charsmap mapping U+50000 to 200 U+FDFA before NFKC (3,600 characters of one), and a
    Regex doing the same, are measured there and refused."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    (tmp_path / "rule.tsv").write_text("50000\t" + " ".join(["FDFA"] * 200) + "\n")
    lines = [line for doc in docs[:100] for line in doc.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=tmp_path / "far",
        normalization_rule_tsv=str(tmp_path / "rule.tsv"),
        vocab_size=200,
        minloglevel=2,
        hard_vocab_limit=False,
        num_threads=1,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((tmp_path / "far.model").read_bytes())
    charsmap = base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode()
    pre = {"type": "Precompiled", "precompiled_charsmap": charsmap}
    _refused(made, "far-charsmap", [pre, {"type": "NFKC"}], "up to 3600 characters")
    far = _replace({"Regex": "\\x{50000}"}, "\ufdfa" * 200)
    _refused(made, "far-regex", [far, {"type": "NFKC"}], "up to 3600 characters")


def test_a_pattern_too_long_to_probe_is_refused_naming_it(made):
    """A String pattern of 20,000 characters in a chain to be measured: probing it could
    hold 20,000 x the static product, so the model is refused, naming the pattern."""
    long = _replace({"String": "x" * 20_000}, "y")
    members = [long, {"type": "NFKC"}, {"type": "Lowercase"}, {"type": "NFKD"}]
    folder = _with(made, "long", members)
    with pytest.raises(InvalidSpecError, match="too long to probe") as e:
        load_tokenizer(TokenizerSpec(model=folder, kind="huggingface")).encode(["a b"])
    assert folder in str(e.value)
