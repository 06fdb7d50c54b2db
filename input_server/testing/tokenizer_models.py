"""Small Hugging Face and tiktoken tokenizers trained offline on real text.

Tests, the demo and the benchmarks make their models with these at run time (nothing is
downloaded), the way `corpus.train_sentencepiece` makes a sentencepiece one:

- `train_hf_tokenizer`: a byte-level BPE trained with the `tokenizers` library's own trainer,
  saved as Hugging Face saves a tokenizer: a folder with `tokenizer.json` and
  `tokenizer_config.json` naming its BOS, EOS and (optionally) pad tokens.
- `train_qwen2_bpe`, `write_hf_folder`: a checkpoint's tokenizer folder as Qwen's are, the
  class named in `tokenizer_config.json` (what MaxText's `qwen3-tokenizer` holds).
- `write_tiktoken_model`: the same kind of BPE written as a tiktoken ranks file (one
  `base64(token bytes) rank` line per token, what `tiktoken.load.load_tiktoken_bpe` reads), the
  format of Llama 3's `tokenizer.model`.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_level_bpe(docs: Iterable[str], vocab_size: int, special_tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def train_hf_tokenizer(
    docs: Iterable[str],
    folder: str | os.PathLike,
    *,
    vocab_size: int = 1000,
    with_pad: bool = True,
    template: bool = True,
) -> str:
    """Trains a byte-level BPE and saves it in `folder` (made if missing); returns the folder.

    The tokens are BOS, EOS, then (with `with_pad`) pad, as ids 0, 1, 2; a model without a pad
    token has `pad_token_id` None, as Llama 3's. `template=True` gives `tokenizer.json` a
    post-processor that prepends BOS, as Llama 3's does (transformers replaces it when asked
    for `add_bos_token`/`add_eos_token`, as MaxText asks).
    """
    from tokenizers import processors

    specials = [BOS, EOS, *([PAD] if with_pad else [])]
    tok = _byte_level_bpe(docs, vocab_size, specials)
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
        )
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        **({"pad_token": PAD} if with_pad else {}),
        "model_max_length": 1 << 20,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    return os.fspath(folder)


def _bytes_of_byte_level() -> dict[str, int]:
    """The byte each character of the byte-level alphabet stands for (GPT-2's mapping)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def write_tiktoken_model(
    docs: Iterable[str], path: str | os.PathLike, *, vocab_size: int = 1000
) -> str:
    """Trains a byte-level BPE of `vocab_size` tokens and writes it as tiktoken ranks; returns
    the path. Ranks: the 256 bytes first, then each merge in the order it was learned, so a
    token's parts always rank below it, as tiktoken's encoder needs. The special tokens are not
    in the file: tiktoken users (MaxText's `TikTokenTokenizer`) add them after the ranks."""
    tok = _byte_level_bpe(docs, vocab_size, [])
    to_byte = _bytes_of_byte_level()
    vocab = tok.get_vocab()  # token (byte-level characters) -> id, ids in learning order
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        raw = bytes(to_byte[c] for c in token)
        if raw not in ranks:
            ranks[raw] = len(ranks)
    with open(path, "w", encoding="ascii") as f:
        for raw, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(raw).decode()} {rank}\n")
    return os.fspath(path)


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
