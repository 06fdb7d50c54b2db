"""A Hugging Face `tokenizer_config.json` read as transformers reads it: the class it names
(reproduced or refused), its named and added tokens, the class's defaults for those left out.

transformers 5 (`AutoTokenizer.from_pretrained`, `tokenization_auto.py`) builds the class the
config names. `TokenizersBackend` (alias `PreTrainedTokenizerFast`) loads `tokenizer.json` as
it stands. A class with its own `__init__` (`Qwen2Tokenizer`, ...) does not: its
`convert_to_native_format` (`tokenization_utils_tokenizers.py`) takes only the vocabulary,
merges and post-processor from the file and the `__init__` builds the normalizer, pre-tokenizer
and model options itself; the file's `added_tokens` are dropped, and the config's
`added_tokens_decoder` and named tokens added back. Such a class is taken here only where what
it builds is the file's own pipeline (compared piece by piece, so ids are the file's and the
class's alike, in transformers 4 too, which loaded the file as it stood); anything else is
refused by name with the way out, never approximated.
"""

from __future__ import annotations

import json
from collections.abc import Callable

# Classes that take tokenizer.json as it stands (transformers 5's `TokenizersBackend`, whose
# old name is `PreTrainedTokenizerFast`; Bloom's are mapped to it by `tokenizer_class_from_name`).
FILE_CLASSES = (
    None,
    "PreTrainedTokenizerFast",
    "TokenizersBackend",
    "BloomTokenizer",
    "BloomTokenizerFast",
)
# Qwen2Tokenizer's pre-tokenizer regex (transformers/models/qwen2/tokenization_qwen2.py).
QWEN2_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Sentencepiece-based classes whose transformers 5 `__init__` rebuilds a Metaspace / byte-fallback
# pipeline the server does not reproduce; their `tokenizer.model` is what `kind =
# "sentencepiece"` reads.
SENTENCEPIECE_CLASSES = {
    "LlamaTokenizer",
    "CodeLlamaTokenizer",
    "GemmaTokenizer",
    "T5Tokenizer",
    "AlbertTokenizer",
    "XLMRobertaTokenizer",
    "CamembertTokenizer",
}


def _qwen2(config: dict) -> dict:
    """What Qwen2Tokenizer.__init__ builds (transformers 5.x, tokenization_qwen2.py): NFC,
    its split regex then byte-level, a plain byte-level BPE."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    space = config.get("add_prefix_space")
    split = pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False)
    level = pre_tokenizers.ByteLevel(add_prefix_space=bool(space), use_regex=False)
    return {
        "normalizer": normalizers.NFC(),
        "pre_tokenizer": pre_tokenizers.Sequence([split, level]),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
        },
    }


# Class -> (what its __init__ builds from the config, its named tokens' defaults when the config
# has no such key; an explicit null in the config stays null, as transformers passes it on).
REBUILT: dict[str, tuple[Callable[[dict], dict], dict[str, str | None]]] = {
    "Qwen2Tokenizer": (
        _qwen2,
        {
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
        },
    ),
}
REBUILT["Qwen2TokenizerFast"] = REBUILT["Qwen2Tokenizer"]  # v5: `XFast` loads `X`
TAKEN = ", ".join(map(str, [*FILE_CLASSES[1:3], *REBUILT]))


def _ids_only(node):
    """A piece's description without `trim_offsets`, which moves offsets, never ids (the Qwen3
    file says false, Qwen2Tokenizer's ByteLevel keeps tokenizers' default, true)."""
    if isinstance(node, dict):
        return {k: _ids_only(v) for k, v in node.items() if k != "trim_offsets"}
    if isinstance(node, list):
        return [_ids_only(v) for v in node]
    return node


def _state(piece) -> object:
    return None if piece is None else _ids_only(json.loads(piece.__getstate__()))


def _model_options(tok) -> dict:
    """The file's model options (vocabulary and merges apart: transformers takes those from the
    file whatever the class)."""
    from tokenizers import models

    m = tok.model
    if not isinstance(m, models.BPE):  # every class taken here builds a BPE
        return {"type": type(m).__name__}
    return {
        "type": "BPE",
        "dropout": m.dropout,
        "unk_token": m.unk_token,
        "continuing_subword_prefix": m.continuing_subword_prefix or "",
        "end_of_word_suffix": m.end_of_word_suffix or "",
        "fuse_unk": m.fuse_unk,
        "byte_fallback": m.byte_fallback,
        "ignore_merges": m.ignore_merges,
    }


def _byte_level(tok) -> bool:
    """Whether the file has a ByteLevel piece, as transformers' `_tokenizer_json_has_byte_level`
    looks for `"ByteLevel"` in the file (here in its pieces, not its vocabulary)."""
    pieces = (tok.normalizer, tok.pre_tokenizer, tok.post_processor, tok.decoder)
    return any(b'"ByteLevel"' in p.__getstate__() for p in pieces if p is not None)


def _difference(have, want, at: str) -> tuple[str, object, object]:
    """The first place two descriptions differ: its path, the file's value, the class's."""
    if isinstance(have, dict) and isinstance(want, dict):
        for k in [*want, *(k for k in have if k not in want)]:
            if have.get(k) != want.get(k):
                return _difference(have.get(k), want.get(k), f"{at}.{k}")
    if isinstance(have, list) and isinstance(want, list) and len(have) == len(want):
        for i, (h, w) in enumerate(zip(have, want, strict=True)):
            if h != w:
                return _difference(h, w, f"{at}[{i}]")
    return at, have, want


def class_defaults(name, tok, config: dict) -> tuple[dict[str, str | None], bool]:
    """The named tokens' defaults for the config's `tokenizer_class` `name`, and whether the
    class rebuilds the tokenizer (then the file's added tokens must be the config's).

    Raises:
        ValueError: the class is not one the server reproduces, or what it would build differs
            from the file's own pipeline; the message says why and what to do instead.
    """
    if name in FILE_CLASSES:
        return {}, False
    if not isinstance(name, str):
        raise ValueError(f"its tokenizer_config.json's tokenizer_class is {name!r}, not a name")
    if name.removesuffix("Fast") == "LlamaTokenizer" and _byte_level(tok):
        # AutoTokenizer loads TokenizersBackend for these (tokenization_auto.py: "Hub repos that
        # declare this but ship ByteLevel (Llama3 style) must use TokenizersBackend"): DeepSeek's
        # and Llama 3 derivatives' folders.
        return {}, False
    recipe = REBUILT.get(name)
    way_out = (
        "; if its tokenizer.json is the tokenizer the model was trained with, set "
        '"tokenizer_class": "TokenizersBackend" in tokenizer_config.json (transformers then '
        "loads the file as it stands, as the server does)"
    )
    if recipe is None:
        base = name.removesuffix("Fast")
        if base in SENTENCEPIECE_CLASSES:
            why = (
                f"transformers 5 rebuilds {name} as a sentencepiece-style pipeline of its own, "
                f'which the server does not reproduce; use `kind = "sentencepiece"` with the '
                f"checkpoint's tokenizer.model if it has one"
            )
        else:
            why = f"the server reproduces only {TAKEN}"
        raise ValueError(f"its tokenizer_config.json says tokenizer_class {name!r}: {why}{way_out}")
    build, defaults = recipe
    built = build(config)
    have = {
        "normalizer": _state(tok.normalizer),
        "pre_tokenizer": _state(tok.pre_tokenizer),
        "model": _model_options(tok),
    }
    for piece in ("normalizer", "pre_tokenizer", "model"):
        want = built[piece] if piece == "model" else _state(built[piece])
        if have[piece] != want:
            at, there, own = _difference(have[piece], want, piece)
            raise ValueError(
                f"its tokenizer_config.json says tokenizer_class {name!r}, which transformers 5 "
                f"builds with a {piece} of its own, not its tokenizer.json's ({at}: "
                f"{json.dumps(there)[:120]} there, {json.dumps(own)[:120]} in {name}), so the "
                f"ids would not be the file's{way_out}"
            )
    return {k: defaults[k] for k in defaults if k not in config}, True


NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")


def content(token) -> str | None:
    """A named token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def named_tokens(config: dict, mapped: dict, tok) -> tuple[dict[str, str | None], list[str]]:
    """The named tokens (the config's, else its class's defaults) and the extra special tokens,
    checking the config's added tokens against the file's (`tok`).

    Raises:
        ValueError: what transformers would read otherwise than the server does.
    """
    defaults, rebuilt = class_defaults(config.get("tokenizer_class"), tok, config)
    named = {k: content(config[k]) if k in config else defaults.get(k) for k in NAMED}
    for k in NAMED:
        other = content(mapped.get(k))
        if other is not None and other != named[k]:
            raise ValueError(
                f"its special_tokens_map.json names {k} {other!r} but tokenizer_config.json "
                f"{named[k]!r}; the server reads tokenizer_config.json's: make them agree"
            )
    extra: list[str] = []
    # What `extra` holds, as a set: the same lists in special_tokens_map.json and
    # tokenizer_config.json (as save_pretrained writes them) made a look-up in the list
    # quadratic in their length, for a config up to MAX_CONFIG_BYTES.
    seen: set[str] = set()
    for source in (config, mapped):
        for key in ("additional_special_tokens", "extra_special_tokens"):
            tokens = source.get(key) or []
            if isinstance(tokens, dict):  # {name: token}
                tokens = list(tokens.values())
            if not isinstance(tokens, list):
                raise ValueError(f"its {key} is not a list")
            # Left out when an earlier list has it; a list's own repeats stay, as they always
            # did (the loader adds each missing token once).
            new = [t for t in map(content, tokens) if t is not None and t not in seen]
            extra += new
            seen.update(new)
    _check_added(config.get("added_tokens_decoder") or {}, tok, rebuilt)
    return named, extra


def _check_added(added, tok, rebuilt: bool) -> None:
    """The config's added tokens must be the file's, same ids; for a class that rebuilds the
    tokenizer, the other way too, flags and all (it drops the file's and adds the config's)."""
    if not isinstance(added, dict):
        raise ValueError("its tokenizer_config.json's added_tokens_decoder is not a table")
    have = {t.content: (i, t) for i, t in tok.get_added_tokens_decoder().items()}
    for i, t in added.items():
        name = content(t)
        if name is not None and str(have.get(name, (None,))[0]) != str(i):
            raise ValueError(
                f"its tokenizer_config.json adds token {name!r} as id {i}, which its "
                f"tokenizer.json does not hold; save both from one tokenizer"
            )
    if not rebuilt:
        return
    for name, (i, t) in have.items():
        want = added.get(str(i))
        if not isinstance(want, dict) or want.get("content") != name:
            raise ValueError(
                f"its tokenizer.json adds token {name!r} (id {i}) that tokenizer_config.json's "
                f"added_tokens_decoder lacks, which transformers then drops; save both from "
                f"one tokenizer"
            )
        flags = {
            "lstrip": t.lstrip,
            "rstrip": t.rstrip,
            "normalized": t.normalized,
            "single_word": t.single_word,
            "special": t.special,
        }
        differ = [f for f, v in flags.items() if f in want and bool(want[f]) != v]
        if differ:
            raise ValueError(
                f"its tokenizer.json and tokenizer_config.json add token {name!r} with other "
                f"{', '.join(differ)}; save both from one tokenizer"
            )
