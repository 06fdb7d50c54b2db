"""Hostile and wrong model files through the real server: a model whose normalizer multiplies
text, a damaged or panicking model, a tiktoken file too large to hold, a file given under the
wrong kind. Each is refused by name (INVALID_ARGUMENT naming the model), never INTERNAL.

The hostile models here multiply text by 2,000, not the 20,000-100,000 of the measured
attacks: on code without the bounds a test that fails still only makes megabytes.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil

import grpc
import numpy as np
import pytest

from input_client import InputClient, PipelineSpec, StreamError
from input_client.spec import TokenizerSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.trainers import train_hf_tokenizer, write_tiktoken_model

EXPANSION = 2000  # characters a hostile normalizer makes of one


@pytest.fixture(scope="module")
def models(docs, tmp_path_factory) -> dict[str, str]:
    """A good model of each kind, and small hostile ones made from them."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("hostile")
    lines = [line for doc in docs[:200] for line in doc.splitlines() if line.strip()]
    out = {
        "hf": train_hf_tokenizer(docs[:300], d / "hf", vocab_size=400),
        "tiktoken": write_tiktoken_model(docs[:300], d / "m.tiktoken", vocab_size=400),
    }
    common = dict(vocab_size=200, minloglevel=2, hard_vocab_limit=False, num_threads=1)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=d / "spm", **common)
    out["spm"] = str(d / "spm.model")
    # sentencepiece's own rule file: "§" (U+00A7) becomes EXPANSION "N"s, compiled into the
    # model's precompiled charsmap as a downloaded hostile model would hold it (the measured
    # one mapped "e"; a character the training text lacks keeps the training fast).
    (d / "rule.tsv").write_text("A7\t" + " ".join(["4E"] * EXPANSION) + "\n")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=d / "charsmap",
        normalization_rule_tsv=str(d / "rule.tsv"),
        **common,
    )
    out["charsmap"] = str(d / "charsmap.model")
    return out


def _hf_variant(models, tmp_path, name: str, change) -> str:
    folder = shutil.copytree(models["hf"], tmp_path / name)
    model = json.loads((folder / "tokenizer.json").read_text())
    change(model)
    (folder / "tokenizer.json").write_text(json.dumps(model))
    return str(folder)


def _describe_error(server, model: str, kind: str) -> StreamError:
    spec = PipelineSpec(source={"paths": ["x.jsonl"]}, tokenizer={"model": model, "kind": kind})
    with InputClient(server.targets[0]) as c, pytest.raises(StreamError) as e:
        c.describe_tokenizer(spec)
    return e.value


def _stream_error(server, corpus: str, model: str, kind: str) -> StreamError:
    spec = PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": model, "kind": kind},
        batch={"seq_len": 64, "size": 2},
        workers={"count": 0},
    )
    with InputClient(server.targets[0]) as c, pytest.raises(StreamError) as e:
        with c.batches(spec) as it:
            for _ in range(50):
                next(it)
    return e.value


def _names(err: StreamError, model: str, *needles: str) -> None:
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert model in err.details, err
    for needle in needles:
        assert needle in err.details, err


def test_a_normalizer_that_multiplies_text_is_refused_before_any_document(models, server, tmp_path):
    """Measured: a tokenizer.json replacing each space with 100,000 characters, and a 36 KB
    sentencepiece model mapping "e" to 20,000, OOM-killed a 3 GB server on one request.
    Refused at load, naming the bound, whether described or streamed."""
    hostile_hf = _hf_variant(
        models,
        tmp_path,
        "spaces",
        lambda m: m.update(
            normalizer={"type": "Replace", "pattern": {"String": " "}, "content": "x" * EXPANSION}
        ),
    )
    # Doubling by a chain: each link is small, the product is not.
    link = {"type": "Replace", "pattern": {"String": " "}, "content": "  "}
    chained = _hf_variant(
        models,
        tmp_path,
        "chain",
        lambda m: m.update(normalizer={"type": "Sequence", "normalizers": [link] * 12}),
    )
    for model, kind in [
        (hostile_hf, "huggingface"),
        (chained, "huggingface"),
        (models["charsmap"], "sentencepiece"),
    ]:
        _names(_describe_error(server, model, kind), model, "MAX_NORMALIZER_EXPANSION")
    corpus = write_jsonl(["see \u00a7 the free tree \u00a7"] * 40, tmp_path / "e.jsonl")
    err = _stream_error(server, corpus, models["charsmap"], "sentencepiece")
    _names(err, models["charsmap"], f"up to {EXPANSION} characters")
    # The server still serves: the good models load.
    spec = PipelineSpec(source={"paths": ["x.jsonl"]}, tokenizer={"model": models["spm"]})
    with InputClient(server.targets[0]) as c:
        assert c.describe_tokenizer(spec).vocab_size == 200


def test_usual_normalizers_load(models, tmp_path):
    """The bound leaves real normalizers alone: Llama's Prepend + Replace, NFKC + lowercase,
    Bert's, and sentencepiece's nmt_nfkc charsmap (the default of the trained model)."""
    llama = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    nfkc = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    bert = {
        "type": "BertNormalizer",
        "clean_text": True,
        "handle_chinese_chars": True,
        "strip_accents": None,
        "lowercase": True,
    }
    for i, norm in enumerate([llama, nfkc, bert]):
        folder = _hf_variant(
            models, tmp_path, f"usual{i}", lambda m, n=norm: m.update(normalizer=n)
        )
        tok = load_tokenizer(TokenizerSpec(model=folder, kind="huggingface"))
        assert len(tok.encode(["Return the number of items."]).tokens) > 3
    assert load_tokenizer(TokenizerSpec(model=models["spm"])).vocab_size == 200


def test_a_panicking_pre_tokenizer_is_invalid_argument_naming_the_model(models, server, tmp_path):
    """A catastrophic regex in a Split pre-tokenizer makes Oniguruma give up with a Rust panic
    (pyo3's PanicException, a BaseException): INTERNAL before, now the model's fault."""
    split = {
        "type": "Split",
        "pattern": {"Regex": "(a|aa)+$"},
        "behavior": "Isolated",
        "invert": False,
    }
    model = _hf_variant(models, tmp_path, "regex", lambda m: m.update(pre_tokenizer=split))
    corpus = write_jsonl(["a" * 60 + "c"] * 8, tmp_path / "a.jsonl")
    err = _stream_error(server, corpus, model, "huggingface")
    _names(err, model, "PanicException", "retry-limit")


def test_a_damaged_sentencepiece_model_is_invalid_argument_naming_it(models, server, tmp_path):
    """A piece that is not UTF-8 (3 of 300 damaged models in the review): sentencepiece loads
    it, and reading the pieces raised UnicodeDecodeError, answered INTERNAL."""
    import sentencepiece as spm

    data = open(models["spm"], "rb").read()
    sp = spm.SentencePieceProcessor(model_file=models["spm"])
    piece = next(
        b
        for b in (sp.id_to_piece(i).encode() for i in range(5, sp.get_piece_size()))
        if len(b) >= 3 and data.count(b) == 1
    )
    bad = tmp_path / "damaged.model"
    bad.write_bytes(data.replace(piece, b"\xff" + piece[1:]))
    _names(_describe_error(server, str(bad), "sentencepiece"), str(bad), "UnicodeDecodeError")


def test_a_tiktoken_file_past_the_ranks_cap_is_refused_naming_the_cap(server, tmp_path):
    """Measured: a 209 MB ranks file of 10 M lines grew the server past 3 GB on one
    DescribeTokenizer. Here 2^20 + 1 lines (13 MB), refused at the cap; and one line with no
    newline is refused at MAX_LINE_BYTES, never read whole."""
    from input_server.data.tokenizers import tiktoken as tiktoken_tokenizer

    cap = 1 << 20
    many = tmp_path / "many.tiktoken"
    with open(many, "w", encoding="ascii") as f:
        for r in range(cap + 1):
            f.write(f"{base64.b64encode(r.to_bytes(3, 'big')).decode()} {r}\n")
    _names(_describe_error(server, str(many), "tiktoken"), str(many), "MAX_RANKS")
    line = tmp_path / "line.tiktoken"
    line.write_bytes(b"QUFB" * (1 << 20))  # 4 MB, valid base64, no newline
    _names(_describe_error(server, str(line), "tiktoken"), str(line), "MAX_LINE_BYTES")
    assert tiktoken_tokenizer.MAX_RANKS == cap  # the cap this test was sized for


def test_a_hugging_face_model_is_loaded_once_for_every_bos_eos_pair(models, tmp_path):
    """Measured: one cached copy per (files, add_bos, add_eos), 1.5 GB each for a 110 MB
    file, so three flag pairs killed a 3 GB server. Now one copy, BOS/EOS added per use."""
    folder = str(shutil.copytree(models["hf"], tmp_path / "hf"))
    text = ["Return the number of items in a container."]
    loaded, ids = set(), {}
    for bos in (True, False):
        for eos in (True, False):
            tok = load_tokenizer(
                TokenizerSpec(model=folder, kind="huggingface", add_bos=bos, add_eos=eos)
            )
            loaded.add(id(tok.model()))
            ids[bos, eos] = tok.encode(text).tokens.tolist()
    assert len(loaded) == 1
    info = tok.info()
    body = ids[False, False]
    assert ids[True, True] == [info.bos_id, *body, info.eos_id]
    assert ids[True, False] == [info.bos_id, *body]
    assert ids[False, True] == [*body, info.eos_id]


def test_a_tokenizer_json_too_large_to_load_is_refused_before_reading(server, tmp_path):
    """A tokenizer.json loads to about 16 x its bytes: one past the loaded-model budget is
    refused from its size, before any byte is read (sparse: no disk is used)."""
    from input_server.data.tokenizers.huggingface import HuggingFaceTokenizer

    limit = 128 << 20  # a 2 GB budget over the 16 x estimate
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "tokenizer.json", "wb") as f:
        f.truncate(limit + 1)
    err = _describe_error(server, str(tmp_path / "big"), "huggingface")
    _names(err, str(tmp_path / "big"), "loaded models")
    assert HuggingFaceTokenizer.MAX_FILE_BYTES == limit


def test_a_sentencepiece_model_too_large_to_load_is_refused_before_reading(server, tmp_path):
    """A sentencepiece model peaked at 11.6 x its bytes loaded: past 128 MB it is refused
    from its size (sparse: no disk is used), where the 1 GB cap of any model let it load."""
    big = tmp_path / "big.model"
    with open(big, "wb") as f:
        f.truncate((128 << 20) + 1)
    _names(_describe_error(server, str(big), "sentencepiece"), str(big), "128 MB")


@pytest.mark.parametrize(
    "given, kind, needle",
    [
        ("tiktoken", "sentencepiece", 'set `kind = "tiktoken"`'),
        ("hf_file", "sentencepiece", 'set `kind = "huggingface"`'),
        ("spm", "tiktoken", 'set `kind = "sentencepiece"`'),
        ("hf_file", "tiktoken", 'set `kind = "huggingface"`'),
        ("spm", "huggingface", 'set `kind = "sentencepiece"`'),
        ("tiktoken", "huggingface", 'set `kind = "tiktoken"`'),
    ],
)
def test_a_model_of_another_kind_says_which_kind_it_looks_like(models, server, given, kind, needle):
    model = os.path.join(models["hf"], "tokenizer.json") if given == "hf_file" else models[given]
    _names(_describe_error(server, model, kind), model, needle)


def test_a_hugging_face_model_may_name_its_file_and_a_missing_one_says_what_it_is(
    models, server, tmp_path
):
    """`model` naming the tokenizer.json file, whatever its name, is read as that file; a
    missing one says that huggingface's `model` is the folder or the file."""
    from input_client import model_files

    named = tmp_path / "hf-file"
    shutil.copy(os.path.join(models["hf"], "tokenizer.json"), named)
    spec = PipelineSpec(
        source={"paths": ["x.jsonl"]}, tokenizer={"model": str(named), "kind": "huggingface"}
    )
    with InputClient(server.targets[0]) as c:
        info = c.describe_tokenizer(spec)
    # The client hashes the same files as the server (what MaxText's check compares).
    assert info.vocab_size == 400
    assert info.sha256 == model_files.digest(model_files.hf_files(str(named)))
    err = _describe_error(server, str(tmp_path / "nowhere"), "huggingface")
    assert err.code == grpc.StatusCode.NOT_FOUND, err
    assert "the folder holding tokenizer.json" in err.details, err


def test_add_bos_without_a_bos_token_warns_naming_the_model(models, tmp_path, caplog):
    """A bare tokenizer.json (no tokenizer_config.json) names no BOS: `add_bos = true` adds
    nothing, as MaxText's Hugging Face tokenizer (transformers) adds nothing; said in the
    log, naming the model."""
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(os.path.join(models["hf"], "tokenizer.json"), bare / "tokenizer.json")
    spec = TokenizerSpec(model=str(bare), kind="huggingface", add_bos=True, add_eos=False)
    with caplog.at_level(logging.WARNING):
        tok = load_tokenizer(spec)
        tokens = tok.encode(["Return the number of items."]).tokens
    assert tok.info().bos_id == -1 and not np.isin(tokens, [0, 1]).any()
    said = [r.getMessage() for r in caplog.records if "add_bos" in r.getMessage()]
    assert said and str(bare) in said[0] and "bos_token" in said[0], caplog.text


def test_the_hugging_face_cache_is_bounded_by_the_size_of_what_it_holds(
    models, tmp_path, monkeypatch
):
    """Loaded models are kept within MAX_LOADED_BYTES by their estimated size (16 x their
    files), the least recently used dropped first; the budget is made small here, the
    models stay real."""
    from input_server.data.tokenizers import huggingface as hf_tokenizer

    folders = [str(shutil.copytree(models["hf"], tmp_path / f"hf{i}")) for i in range(3)]
    files = ("tokenizer.json", "tokenizer_config.json")
    one = hf_tokenizer.LOAD_BYTES_PER_FILE_BYTE * sum(
        os.path.getsize(os.path.join(folders[0], f)) for f in files
    )
    monkeypatch.setattr(hf_tokenizer, "MAX_LOADED_BYTES", int(2.5 * one))
    for folder in folders:
        load_tokenizer(TokenizerSpec(model=folder, kind="huggingface")).info()
    held = [key[0][0] for key in hf_tokenizer._LOADED]
    assert sum(e[2] for e in hf_tokenizer._LOADED.values()) <= 2.5 * one
    assert not any(p.startswith(folders[0] + os.sep) for p in held), held
    assert sum(p.startswith((folders[1] + os.sep, folders[2] + os.sep)) for p in held) == 2


def test_the_missing_bos_warning_is_said_once_per_model(models, tmp_path, caplog):
    """A client describing a bare model again and again adds no line a call to the log."""
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(os.path.join(models["hf"], "tokenizer.json"), bare / "tokenizer.json")
    spec = TokenizerSpec(model=str(bare), kind="huggingface", add_bos=True, add_eos=False)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            load_tokenizer(spec).info()
    assert sum("add_bos" in r.getMessage() for r in caplog.records) == 1, caplog.text
