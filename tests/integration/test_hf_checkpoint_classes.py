"""Hugging Face checkpoint folders whose tokenizer_config.json names a model-specific class,
through the real server: a `Qwen2Tokenizer` folder streams the file's ids with the config's
EOS (or the class's default when the config names none), BOS/EOS as asked; the fastokens gate
still serves it; a class the server cannot reproduce is refused naming the file, the class and
the way out.

What is expected comes from transformers 5's code (not installed here; MaxText's venv compares
with it for real in tests/system/test_hf_checkpoint_folders.py): `Qwen2Tokenizer.__init__`
(models/qwen2/tokenization_qwen2.py) builds NFC, its split regex then ByteLevel(use_regex=False)
and a plain BPE, defaulting `eos_token`, `pad_token` and `unk_token` to "<|endoftext|>" and
`bos_token` to None; `TokenizersBackend.update_post_processor` (tokenization_utils_tokenizers.py)
then puts `[BOS] $A [EOS]` as `add_bos_token`/`add_eos_token` say, a flag whose token is None
adding nothing.
"""

from __future__ import annotations

import json
import os

import grpc
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from input_client import InputClient, PipelineSpec, StreamError
from input_client.spec import TokenizerSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.tokenizers import load_tokenizer
from input_server.testing.tokenizer_models import (
    QWEN_SPECIALS,
    train_qwen2_bpe,
    write_hf_folder,
)

SEQ = 256
WRITTEN = ["a chat turn <|im_start|>user hi<|im_end|> then <|endoftext|> ends", ""]


@pytest.fixture(scope="module")
def trained(docs) -> Tokenizer:
    return train_qwen2_bpe(docs[:600])


@pytest.fixture(scope="module")
def folders(trained, tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("hf-classes")
    qwen3 = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return {
        # Qwen3's config as MaxText ships it: EOS <|im_end|>, pad <|endoftext|>, no BOS.
        "qwen3-like": write_hf_folder(
            d / "qwen3", trained, tokenizer_class="Qwen2Tokenizer", **qwen3
        ),
        # No named tokens: Qwen2Tokenizer's defaults (EOS and pad <|endoftext|>).
        "class-defaults": write_hf_folder(
            d / "defaults", trained, tokenizer_class="Qwen2TokenizerFast"
        ),
    }


@pytest.fixture(scope="module")
def texts_file(docs, tmp_path_factory) -> tuple[list[str], str]:
    texts = [*WRITTEN, *docs[600:640]]
    return texts, write_jsonl(texts, tmp_path_factory.mktemp("hf-texts") / "texts.jsonl")


def _spec(texts_path: str, model: str, **tokenizer) -> PipelineSpec:
    return PipelineSpec(
        source={"paths": [texts_path]},
        tokenizer={"model": model, "kind": "huggingface", **tokenizer},
        batch={"seq_len": SEQ, "size": 4, "packing": "none"},
        order={"shuffle": False, "epochs": 1},
        workers={"count": 0},
    )


@pytest.mark.parametrize("which", ["qwen3-like", "class-defaults"])
@pytest.mark.parametrize("bos,eos", [(True, True), (False, False), (True, False), (False, True)])
def test_a_qwen2_class_folder_streams_the_files_ids_with_the_configs_eos(
    server, trained, folders, texts_file, which, bos, eos
):
    texts, path = texts_file
    eos_id = trained.token_to_id("<|im_end|>" if which == "qwen3-like" else "<|endoftext|>")
    spec = _spec(path, folders[which], add_bos=bos, add_eos=eos)
    with InputClient(server.targets[0]) as c, c.batches(spec) as it:
        rows = [r for b in it for r in b["inputs"]]
    assert len(rows) >= len(texts)
    for i, text in enumerate(texts):
        # No BOS ever (the class names none); the file's own ids, specials written included.
        want = [*trained.encode(text, add_special_tokens=False).ids, *([eos_id] if eos else [])]
        want = want[:SEQ]
        assert np.array_equal(rows[i][: len(want)], want), (which, bos, eos, i, text[:60])
        assert not rows[i][len(want) :].any()
    assert trained.token_to_id("<|im_start|>") in rows[0]  # written specials are their ids
    info = load_tokenizer(TokenizerSpec(model=folders[which], kind="huggingface")).info()
    assert (info.bos_id, info.eos_id) == (-1, eos_id)
    assert info.pad_id == trained.token_to_id("<|endoftext|>")


def test_the_fastokens_gate_serves_a_qwen2_class_folder_exactly(folders, texts_file):
    texts, _ = texts_file
    model = os.path.join(folders["qwen3-like"], "tokenizer.json")  # the file named: config read
    fast = load_tokenizer(TokenizerSpec(model=model, kind="huggingface", add_eos=True))
    ref = load_tokenizer(
        TokenizerSpec(model=model, kind="huggingface", add_eos=True, backend="reference")
    )
    assert fast.choose_backend(texts).backend == "fastokens"
    got, want = fast.encode(texts, 0), ref.encode(texts, 0)
    assert np.array_equal(got.tokens, want.tokens) and np.array_equal(got.lengths, want.lengths)
    assert want.tokens[want.starts[0] + want.lengths[0] - 1] == ref.info().eos_id


def _refusal(server, spec) -> StreamError:
    with InputClient(server.targets[0]) as c, pytest.raises(StreamError) as e:
        with c.batches(spec) as it:
            next(it)
    return e.value


def _metaspace(docs: list[str]) -> Tokenizer:
    """A sentencepiece-style (Metaspace) BPE, as Llama 2's and Gemma's tokenizer.json are."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
    return tok


def test_classes_the_server_cannot_reproduce_are_refused_with_the_way_out(
    server, trained, docs, texts_file, tmp_path
):
    _, path = texts_file
    extra = Tokenizer.from_str(trained.to_str())
    extra.add_special_tokens(["<|not_in_config|>"])
    cases = {
        # What Qwen2Tokenizer would build differs from the file: its own pre-tokenizer wins.
        "prefix": (
            write_hf_folder(
                tmp_path / "p", trained, tokenizer_class="Qwen2Tokenizer", add_prefix_space=1
            ),
            ["'Qwen2Tokenizer'", "add_prefix_space", "TokenizersBackend"],
        ),
        "llama": (  # not byte-level: transformers 5 rebuilds it the sentencepiece way
            write_hf_folder(tmp_path / "l", _metaspace(docs), tokenizer_class="LlamaTokenizerFast"),
            ["'LlamaTokenizerFast'", "sentencepiece", "TokenizersBackend"],
        ),
        "whisper": (
            write_hf_folder(tmp_path / "w", trained, tokenizer_class="WhisperTokenizer"),
            ["'WhisperTokenizer'", "Qwen2Tokenizer", "TokenizersBackend"],
        ),
        "added": (  # transformers 5 drops a file's added token the config lacks
            write_hf_folder(tmp_path / "a", extra, tokenizer_class="Qwen2Tokenizer"),
            ["'<|not_in_config|>'", "added_tokens_decoder"],
        ),
    }
    config = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        k: v for k, v in config["added_tokens_decoder"].items() if v["content"] in QWEN_SPECIALS
    }
    (tmp_path / "a" / "tokenizer_config.json").write_text(json.dumps(config))
    for name, (model, needles) in cases.items():
        err = _refusal(server, _spec(path, model))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (name, err)
        for needle in [os.path.basename(model), *needles]:
            assert needle in err.details, (name, needle, err.details)
    # The way out works: the same file under TokenizersBackend is its own pipeline; so is a
    # byte-level file under LlamaTokenizerFast (DeepSeek's, Llama 3 derivatives'), as
    # AutoTokenizer loads it (tokenization_auto.py; tests/system compares the ids).
    fixed = write_hf_folder(tmp_path / "fixed", trained, tokenizer_class="TokenizersBackend")
    llama = write_hf_folder(tmp_path / "byte-level", trained, tokenizer_class="LlamaTokenizerFast")
    for model in (fixed, llama):
        with InputClient(server.targets[0]) as c, c.batches(_spec(path, model)) as it:
            row = next(it)["inputs"][0]
        want = trained.encode(WRITTEN[0], add_special_tokens=False).ids
        assert row[: len(want)].tolist() == want, model
