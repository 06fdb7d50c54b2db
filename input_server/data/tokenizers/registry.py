"""The tokenizer kinds by `tokenizer.kind` name, and a spec's tokenizer opened through them.

Adding a kind: a module with a `ModelTokenizer` subclass (its reference library's `_load`,
`_encode` and `info`, its fast backends' `load_backend`), and its line below.
"""

from __future__ import annotations

import dataclasses

from input_client.spec import TokenizerSpec
from input_server.data.roots import OPERATOR
from input_server.data.tokenizers.base import ModelTokenizer
from input_server.data.tokenizers.huggingface import HuggingFaceTokenizer
from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer
from input_server.data.tokenizers.tiktoken import TiktokenTokenizer

# In `input_client.spec.TOKENIZER_KINDS` order.
KINDS: dict[str, type[ModelTokenizer]] = {
    cls.KIND: cls
    for cls in (
        SentencepieceTokenizer,
        HuggingFaceTokenizer,
        TiktokenTokenizer,
    )
}


def resolve_model(access, spec: TokenizerSpec) -> tuple[str, dict[str, str]]:
    """The files a spec's model is read from, checked against `access`'s data roots and
    bounded in size: the model file, and the files beside it its kind reads too (Hugging
    Face's configs), those that exist."""
    return KINDS[spec.kind].resolve(access, spec)


def open_tokenizer(
    spec: TokenizerSpec, *, written: str | None = None, sidecars: dict | None = None
) -> ModelTokenizer:
    """The tokenizer for `spec`, its `model` already resolved (`resolve_model`); `written` is
    the model as the client wrote it, for messages."""
    return KINDS[spec.kind](spec, written=written, sidecars=sidecars)


def load_tokenizer(spec: TokenizerSpec, access=None, *, keep=None) -> ModelTokenizer:
    """The tokenizer for `spec`, its files found (`resolve_model`) inside `access`'s data roots
    (default: the operator's tools, which see every path); messages name the model as written.
    `keep` (a `keep.ModelKeep`, `serve --tokenizer-cache`) is where what is derived from the
    model is read and kept; None: this process's memory only."""
    model, sidecars = resolve_model(access or OPERATOR, spec)
    tokenizer = open_tokenizer(
        dataclasses.replace(spec, model=model), written=spec.model, sidecars=sidecars
    )
    tokenizer.keep = keep
    return tokenizer
