"""Tokenizer models only the tests and scripts need, made offline at run time (nothing is
downloaded).

- `write_large_bpe`: a large byte-level BPE built without training, to measure loading one.
- `train_qwen2_bpe`, `write_hf_folder`: a checkpoint's tokenizer folder as Qwen's are, the
  class named in `tokenizer_config.json` (what MaxText's `qwen3-tokenizer` holds).

The trained models the product makes too (`bench --kinds`), `train_hf_tokenizer` and
`write_tiktoken_model`, are imported from `input_server.data.tokenizers.trainers`.
"""

from __future__ import annotations

import json
import os

from input_server.data.tokenizers.trainers import BOS, EOS

__all__ = ["QWEN_SPECIALS", "train_qwen2_bpe", "write_hf_folder", "write_large_bpe"]

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_large_bpe(
    folder: str | os.PathLike, tokens: int, *, max_chars: int = 4, seed: int = 0
) -> str:
    """A byte-level BPE `tokenizer.json` of `tokens` random tokens of at most `max_chars`
    characters, each made by a merge of two tokens before it, with a `tokenizer_config.json`
    naming BOS and EOS; returns the folder. Not trained (millions of tokens in seconds): the
    large models an operator may be handed, to measure what loading one costs. Short tokens
    are what fastokens holds in the most memory a byte of file (issue 39)."""
    import random

    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    made, merges, rng = list(alphabet), [], random.Random(seed)
    while len(made) < tokens:
        a = made[rng.randrange(len(made))] if rng.random() < 0.7 else rng.choice(alphabet)
        b = rng.choice(alphabet)
        if len(a) + len(b) <= max_chars and a + b not in vocab:
            vocab[a + b] = len(made)
            made.append(a + b)
            merges.append(f"{a} {b}")
    added = []
    for i, special in enumerate((BOS, EOS)):
        vocab[special] = len(made) + i
        flags = dict.fromkeys(("single_word", "lstrip", "rstrip", "normalized"), False)
        added.append({"id": len(made) + i, "content": special, **flags, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    model = {
        **{"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False},
        **{"continuing_subword_prefix": None, "end_of_word_suffix": None},
        **{"byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    tokenizer = {
        **{"version": "1.0", "truncation": None, "padding": None, "added_tokens": added},
        **{"normalizer": None, "post_processor": None, "model": model},
        **{"pre_tokenizer": {**byte_level, "use_regex": True}, "decoder": byte_level},
    }
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return os.fspath(folder)


def train_qwen2_bpe(docs: list[str]):
    """A byte-level BPE built as transformers' Qwen2Tokenizer builds one (its regex, NFC, no
    prefix space), with Qwen's three specials, trained on `docs`: a checkpoint folder's
    `tokenizer.json` once `write_hf_folder` puts a `tokenizer_config.json` beside it."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from input_server.data.tokenizers.hf_config import QWEN2_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=QWEN_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def write_hf_folder(path, tok, **config) -> str:
    """tok's tokenizer.json beside a tokenizer_config.json holding `config` and, as
    `save_pretrained` writes it, an added_tokens_decoder of the file's added tokens."""
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "rstrip": t.rstrip,
            "normalized": t.normalized,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in tok.get_added_tokens_decoder().items()
    }
    config = {"added_tokens_decoder": added, "model_max_length": 131072, **config}
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return os.fspath(path)
