"""Training small tokenizer models from documents, offline: sentencepiece (`tokenizer train`,
the demo's model), and byte-level BPEs as Hugging Face and tiktoken files (`bench --kinds`).

- `train_sentencepiece`: a sentencepiece model, unigram or BPE, with MaxText's ids (pad 0).
- `train_hf_tokenizer`: a byte-level BPE trained with the `tokenizers` library's own trainer,
  saved as Hugging Face saves a tokenizer: a folder with `tokenizer.json` and
  `tokenizer_config.json` naming its BOS, EOS and (optionally) pad tokens.
- `write_tiktoken_model`: the same kind of BPE written as a tiktoken ranks file (one
  `base64(token bytes) rank` line per token, what `tiktoken.load.load_tiktoken_bpe` reads), the
  format of Llama 3's `tokenizer.model`.
- `write_tekken_model`: the same ranks in a Mistral tekken file (`tekken.json`), special tokens
  first, with Mistral's split pattern.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


def train_sentencepiece(
    docs: Iterable[str],
    model_prefix: str | os.PathLike,
    *,
    vocab_size: int = 1000,
    model_type: str = "unigram",
    with_pad: bool = True,
    exact_vocab: bool = False,
    num_threads: int = 2,
    keep_whitespace: bool = False,
    byte_fallback: bool = False,
    normalization: str = "nmt_nfkc",
) -> str:
    """Trains a small model (sentencepiece's default unigram, or "bpe"); returns its path.

    The defaults are sentencepiece's (NFKC, whitespace runs collapsed, unknown characters
    to unk), which the demo and the tests' fixture models were made with. `keep_whitespace`,
    `byte_fallback` and `normalization="identity"` make a model as Llama's and Gemma's are:
    every space, tab and newline decodes back as it was (a newline or a character the corpus
    lacks as its UTF-8 bytes).

    `with_pad=False` leaves out the pad piece, as Llama 2's model does (`pad_id()` is -1).
    `exact_vocab=True` makes a corpus too small for `vocab_size` an error (sentencepiece's
    RuntimeError names the most it supports) instead of a smaller vocabulary.
    """
    import sentencepiece as spm

    # Train on lines: sentencepiece skips "sentences" over 4192 bytes, and caps their count.
    lines = (line for doc in docs for line in doc.splitlines() if line.strip())
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines,
        model_prefix=os.fspath(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        # 0 stays padding for the batches (MaxText's convention); unk moves to 3.
        **(
            dict(pad_id=0, bos_id=1, eos_id=2, unk_id=3)
            if with_pad
            else dict(pad_id=-1, bos_id=1, eos_id=2, unk_id=0)
        ),
        input_sentence_size=200000,
        shuffle_input_sentence=True,
        num_threads=num_threads,
        hard_vocab_limit=exact_vocab,  # else a small corpus gets the vocabulary it supports
        normalization_rule_name=normalization,
        remove_extra_whitespaces=not keep_whitespace,
        byte_fallback=byte_fallback,
        minloglevel=2,
    )
    return f"{os.fspath(model_prefix)}.model"


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


def _byte_level_ranks(docs: Iterable[str], vocab_size: int) -> dict[bytes, int]:
    """A byte-level BPE of `vocab_size` tokens as ranks: the 256 bytes first, then each merge
    in the order it was learned, so a token's parts always rank below it, as tiktoken's encoder
    needs."""
    tok = _byte_level_bpe(docs, vocab_size, [])
    to_byte = _bytes_of_byte_level()
    vocab = tok.get_vocab()  # token (byte-level characters) -> id, ids in learning order
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        raw = bytes(to_byte[c] for c in token)
        if raw not in ranks:
            ranks[raw] = len(ranks)
    return ranks


def write_tiktoken_model(
    docs: Iterable[str], path: str | os.PathLike, *, vocab_size: int = 1000
) -> str:
    """Trains a byte-level BPE of `vocab_size` tokens and writes it as tiktoken ranks
    (`_byte_level_ranks`); returns the path. The special tokens are not in the file: tiktoken
    users (MaxText's `TikTokenTokenizer`) add them after the ranks."""
    ranks = _byte_level_ranks(docs, vocab_size)
    with open(path, "w", encoding="ascii") as f:
        for raw, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(raw).decode()} {rank}\n")
    return os.fspath(path)


def _text_or_none(raw: bytes) -> str | None:
    """A tekken vocabulary entry's `token_str`: the token as text, None where it is no UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


# The special tokens a tekken file written here lists first, as Mistral's files of version v7 and
# later list theirs (`<unk>`, `<s>`, `</s>` first; `[IMG]`s and the rest follow in real files).
TEKKEN_SPECIALS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<pad>")


def write_tekken_model(
    docs: Iterable[str],
    path: str | os.PathLike,
    *,
    vocab_size: int = 1000,
    num_special: int = 1000,
    keep: int | None = None,
    specials: Iterable[str] | None = TEKKEN_SPECIALS,
    version: str = "v7",
) -> str:
    """Trains a byte-level BPE of `vocab_size` tokens (`_byte_level_ranks`) and writes it as a
    Mistral tekken file (`tekken.json`); returns the path.

    Laid out as Mistral's: a `config` with Mistral's split pattern, the ranks as a `vocab` list
    of `{rank, token_bytes, token_str}`, and `num_special` special tokens numbered first
    (`specials` listed, mistral-common fills the rest; None: no list, as files of version v7
    and before may leave it out). `keep` ranks are used (`default_vocab_size` is `keep` plus
    the specials; default all of them): Mistral's files hold more ranks than they use.
    """
    from input_server.data.tokenizers.tekken import PATTERN

    ranks = _byte_level_ranks(docs, vocab_size)
    keep = len(ranks) if keep is None else keep
    data: dict = {
        "config": {
            "pattern": PATTERN,
            "num_vocab_tokens": len(ranks),
            "default_vocab_size": keep + num_special,
            "default_num_special_tokens": num_special,
            "version": version,
        },
        "vocab": [
            {
                "rank": rank,
                "token_bytes": base64.b64encode(raw).decode(),
                "token_str": _text_or_none(raw),
            }
            for raw, rank in sorted(ranks.items(), key=lambda kv: kv[1])
        ],
    }
    if specials is not None:
        data["special_tokens"] = [
            {"rank": i, "token_str": t, "is_control": True} for i, t in enumerate(specials)
        ]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    return os.fspath(path)
