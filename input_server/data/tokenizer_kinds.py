"""The tokenizer of a spec, whatever its kind: one interface over sentencepiece, Hugging Face
`tokenizers` and tiktoken.

Every kind encodes a group of documents in one call that releases the GIL (so Grain's threads
and the tuner work alike for all), adds BOS/EOS as MaxText's tokenizer class of that kind adds
them, and reports its special ids as `IdsInfo` (what `DescribeTokenizer` answers and what
pre-tokenized ids are checked against).
"""

from __future__ import annotations

import dataclasses
import os

from input_client.spec import TokenizerSpec
from input_server.data.hf_tokenizer import HuggingFaceTokenizer
from input_server.data.tiktoken_tokenizer import TiktokenTokenizer
from input_server.data.tokenizer import Tokenizer
from input_server.data.tokenizer_base import IdsInfo
from input_server.errors import DataNotFoundError

__all__ = ["IdsInfo", "info_of", "load_tokenizer", "open_tokenizer", "resolve_model"]


def resolve_model(access, spec: TokenizerSpec) -> tuple[str, str | None]:
    """The files a spec's model is read from, checked against the data roots: the model file
    and, for Hugging Face, the `tokenizer_config.json` beside its `tokenizer.json` (None if
    there is none). A Hugging Face `model` that does not end in `.json` is a folder, as
    MaxText's `tokenizer_path` is."""
    model = spec.model
    if spec.kind != "huggingface":
        return access.file(model, "tokenizer.model"), None
    if not model.endswith(".json"):
        model = os.path.join(model, "tokenizer.json")
    path = access.file(model, "tokenizer.model")
    try:
        config = access.file(
            os.path.join(os.path.dirname(model), "tokenizer_config.json"), "tokenizer.model"
        )
    except DataNotFoundError:
        config = None
    return path, config if config is None or os.path.isfile(config) else None


def open_tokenizer(spec: TokenizerSpec, *, written: str | None = None, config: str | None = None):
    """The tokenizer for `spec`, its `model` already resolved (`resolve_model`); `written` is
    the model as the client wrote it, for messages."""
    if spec.kind == "huggingface":
        return HuggingFaceTokenizer(spec, written=written, config=config)
    if spec.kind == "tiktoken":
        return TiktokenTokenizer(spec, written=written)
    return Tokenizer(spec, written=written)


def load_tokenizer(spec: TokenizerSpec):
    """The tokenizer for `spec` as the operator's tools open it (no data roots): a Hugging
    Face folder's files found as `resolve_model` finds them."""
    from input_server.data.roots import OPERATOR

    model, config = resolve_model(OPERATOR, spec)
    return open_tokenizer(dataclasses.replace(spec, model=model), written=spec.model, config=config)


def info_of(tokenizer) -> IdsInfo:
    """`IdsInfo` of any kind's tokenizer (sentencepiece's from its processor)."""
    if isinstance(tokenizer, Tokenizer):
        sp = tokenizer.processor()
        return IdsInfo(sp.vocab_size(), sp.bos_id(), sp.eos_id(), sp.pad_id(), sp.unk_id())
    return tokenizer.info()
