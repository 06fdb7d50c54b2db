"""Hugging Face tokenizers (`tokenizer.json`), tokenized as MaxText 0.2.5's `HFTokenizer` does,
with the Rust `tokenizers` library alone (no transformers).

MaxText loads `transformers.AutoTokenizer.from_pretrained(path, add_bos_token=add_bos,
add_eos_token=add_eos)`. Given those two arguments, transformers (5.x, `TokenizersBackend`)
replaces the file's post-processor with `[BOS] $A [EOS]` as the flags say (BOS and EOS being
`tokenizer_config.json`'s `bos_token`/`eos_token`; a flag whose token is unset adds nothing),
and adds the config's named special tokens to the vocabulary as special tokens if the file
lacks them. `encode(text)` then applies the whole `tokenizer.json` pipeline (normalizer,
pre-tokenizer, model, special tokens found in the text). The same is done here, and a group is
one `encode_batch_fast` call, which releases the GIL.

A `tokenizer.json` that pads or truncates is refused: transformers would apply either to each
document, and padding differs between one document and a batch.

Loaded models are shared within a process (`_LOADED`): with `tokenizers` 0.23, every
`Tokenizer` that has encoded once keeps about 0.75 MB after it is dropped (measured: 400 loads
of a 1,000-token model grew a process by 300 MB; one model encoding 300 groups, by 9 MB), so a
server that loaded the model for every stream would grow with every stream.
"""

from __future__ import annotations

import collections
import json
import os
import threading

import numpy as np

from input_server.data.tokenizer_base import IdsInfo, WholeDocumentTokenizer
from input_server.errors import InvalidSpecError, shorten

NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")
# Loaded tokenizers by their files' identity and the BOS/EOS asked for, least recent first.
_LOADED: collections.OrderedDict = collections.OrderedDict()
_LOADED_LOCK = threading.Lock()
MAX_LOADED = 8


def _identity(path: str | None) -> tuple | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:  # gone since it was resolved: loading it names the file
        return (path,)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


def _content(token) -> str | None:
    """A named token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


class HuggingFaceTokenizer(WholeDocumentTokenizer):
    """A `tokenizer.json` with the named tokens of the `tokenizer_config.json` beside it."""

    def __init__(self, spec, *, written: str | None = None, config: str | None = None):
        self.config = config
        super().__init__(spec, written=written)

    def _named(self) -> dict[str, str | None]:
        if self.config is None:
            return dict.fromkeys(NAMED)
        shown = shorten(os.path.join(os.path.dirname(self.written), "tokenizer_config.json"))
        try:
            with open(self.config, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise InvalidSpecError(
                f"`tokenizer.model`: {shown!r} is not a readable JSON file ({e})."
            ) from None
        if not isinstance(config, dict):
            raise InvalidSpecError(f"`tokenizer.model`: {shown!r} is not a JSON object.")
        return {k: _content(config.get(k)) for k in NAMED}

    def _load(self):
        self._open_check(self.spec.model)
        key = (
            _identity(self.spec.model),
            _identity(self.config),
            self.spec.add_bos,
            self.spec.add_eos,
        )
        with _LOADED_LOCK:
            if key in _LOADED:
                _LOADED.move_to_end(key)
                tok, self._ids = _LOADED[key]
                return tok
        tok = self._build()
        with _LOADED_LOCK:
            _LOADED[key] = (tok, self._ids)
            while len(_LOADED) > MAX_LOADED:
                _LOADED.popitem(last=False)
        return tok

    def _build(self):
        from tokenizers import AddedToken, Tokenizer, processors

        shown = shorten(self.written)
        try:
            tok = Tokenizer.from_file(self.spec.model)
        except Exception as e:  # the Rust side raises plain Exception for a bad file
            raise InvalidSpecError(
                f"`tokenizer.model` {shown!r} is not a Hugging Face tokenizer.json ({e})."
            ) from None
        for what, on in (("padding", tok.padding), ("truncation", tok.truncation)):
            if on:
                raise InvalidSpecError(
                    f"`tokenizer.model` {shown!r}: its tokenizer.json sets {what} ({on}); the "
                    f"server packs whole documents: save it with {what} off."
                )
        named = self._named()
        have = {t.content for t in tok.get_added_tokens_decoder().values()}
        missing = [t for t in named.values() if t is not None and t not in have]
        if missing:  # as transformers adds them
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
        bos = named["bos_token"] if self.spec.add_bos else None
        eos = named["eos_token"] if self.spec.add_eos else None
        single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
        tok.post_processor = processors.TemplateProcessing(
            single=single,
            pair=f"{single} $B:1",
            special_tokens=[(t, tok.token_to_id(t)) for t in (bos, eos) if t],
        )
        self._ids = {k: -1 if t is None else tok.token_to_id(t) for k, t in named.items()}
        return tok

    def info(self) -> IdsInfo:
        tok = self.model()
        ids = self._ids
        return IdsInfo(
            tok.get_vocab_size(with_added_tokens=True),
            ids["bos_token"],
            ids["eos_token"],
            ids["pad_token"],
            ids["unk_token"],
        )

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self.model().encode_batch_fast(texts, add_special_tokens=True)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_ids", None)
        return state
