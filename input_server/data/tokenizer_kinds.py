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

from input_client.model_files import HF_FILES
from input_client.spec import TokenizerSpec
from input_server.data.hf_tokenizer import (
    LOAD_BYTES_PER_FILE_BYTE,
    MAX_LOADED_BYTES,
    HuggingFaceTokenizer,
)
from input_server.data.roots import OPERATOR
from input_server.data.tiktoken_tokenizer import TiktokenTokenizer
from input_server.data.tokenizer import Tokenizer
from input_server.data.tokenizer_base import IdsInfo
from input_server.errors import DataNotFoundError, InvalidSpecError, UnreadableError, shorten

__all__ = [
    "IdsInfo",
    "files_of",
    "info_of",
    "load_tokenizer",
    "open_tokenizer",
    "resolve_model",
]

# The most a model file may hold: each kind reads it whole into memory (a named 5 GB jsonl would
# otherwise be read as a model). Real ones are far smaller: Llama 3's tiktoken ranks 2.2 MB,
# large Hugging Face tokenizer.json files tens of MB, sentencepiece models a few MB.
MAX_MODEL_BYTES = 1 << 30
MAX_CONFIG_BYTES = 16 << 20
# What one load may take is checked before it, from the file's size. A tokenizer.json loads to
# about 14 x its bytes (hf_tokenizer.LOAD_BYTES_PER_FILE_BYTE), so its file may hold what fills
# the loaded-model budget; a tiktoken file's ranks are read into a dict and copied by tiktoken
# (Llama 3's file is 2.2 MB, o200k's 3.6 MB); a sentencepiece model peaked at 11.6 x its bytes
# (measured while writing this: a 20 MB model of 1 M pieces, 147 MB loaded plus 87 MB for the
# ModelProto parsed here), and real ones are a few MB (Gemma 3's 262,144 pieces: 4.7 MB).
MAX_MODEL_BYTES_OF_KIND = {
    "huggingface": MAX_LOADED_BYTES // LOAD_BYTES_PER_FILE_BYTE,
    "tiktoken": 64 << 20,
    "sentencepiece": 128 << 20,
}


def _bounded(path: str | None, limit: int, written: str, why: str = "") -> str | None:
    try:
        size = os.stat(path).st_size if path is not None else 0
    except OSError:  # missing: opening it names it
        return path
    if size > limit:
        raise InvalidSpecError(
            f"`tokenizer.model` {shorten(written)!r} holds {size} bytes, more than the "
            f"{limit >> 20} MB a model file may{why}."
        )
    return path


def _model_limit(kind: str) -> tuple[int, str]:
    limit = MAX_MODEL_BYTES_OF_KIND.get(kind, MAX_MODEL_BYTES)
    if kind == "huggingface":
        return limit, (
            f" (loaded, it would take about {LOAD_BYTES_PER_FILE_BYTE} x that, past the "
            f"{MAX_LOADED_BYTES >> 20} MB the server gives loaded models)"
        )
    return limit, f" as a {kind} model" if limit != MAX_MODEL_BYTES else ""


def _hf_file(access, model: str) -> str:
    """A Hugging Face `model` as written: the tokenizer.json itself (a name ending in .json,
    or a regular file of another name), else the folder holding it."""
    if model.endswith(".json"):
        return model
    try:
        found = access.file(model, "tokenizer.model")
    except (DataNotFoundError, UnreadableError):  # a folder, or nothing: the folder's file
        return os.path.join(model, "tokenizer.json")
    return model if os.path.isfile(found) else os.path.join(model, "tokenizer.json")


def resolve_model(access, spec: TokenizerSpec) -> tuple[str, dict[str, str]]:
    """The files a spec's model is read from, checked against the data roots: the model file
    and, for Hugging Face, the files beside its `tokenizer.json` that name its tokens
    (`input_client.model_files.HF_FILES`), those that exist. A Hugging Face `model` is its
    tokenizer.json file, or the folder holding it, as MaxText's `tokenizer_path` is."""
    model = spec.model
    limit, why = _model_limit(spec.kind)
    if spec.kind != "huggingface":
        return _bounded(access.file(model, "tokenizer.model"), limit, model, why), {}
    model = _hf_file(access, model)
    try:
        found = access.file(model, "tokenizer.model")
    except DataNotFoundError as e:
        raise DataNotFoundError(
            f"{str(e).rstrip('.')}: a Hugging Face `tokenizer.model` is the folder holding "
            f"tokenizer.json (as MaxText's `tokenizer_path`) or the tokenizer.json file itself."
        ) from None
    path = _bounded(found, limit, model, why)
    sidecars = {}
    for name in HF_FILES[1:]:
        written = os.path.join(os.path.dirname(model), name)
        try:
            found = access.file(written, "tokenizer.model")
        except DataNotFoundError:
            continue
        if os.path.isfile(found):  # the operator's own tools see every path
            sidecars[name] = _bounded(found, MAX_CONFIG_BYTES, written)
    return path, sidecars


def open_tokenizer(spec: TokenizerSpec, *, written: str | None = None, sidecars=None):
    """The tokenizer for `spec`, its `model` already resolved (`resolve_model`); `written` is
    the model as the client wrote it, for messages."""
    if spec.kind == "huggingface":
        return HuggingFaceTokenizer(spec, written=written, sidecars=sidecars)
    if spec.kind == "tiktoken":
        return TiktokenTokenizer(spec, written=written)
    return Tokenizer(spec, written=written)


def load_tokenizer(spec: TokenizerSpec, access=None):
    """The tokenizer for `spec`, its files found (`resolve_model`) inside `access`'s data roots
    (default: the operator's tools, which see every path); messages name the model as written."""
    model, sidecars = resolve_model(access or OPERATOR, spec)
    return open_tokenizer(
        dataclasses.replace(spec, model=model), written=spec.model, sidecars=sidecars
    )


def files_of(tokenizer) -> dict[str, str]:
    """The files its tokens come from, as `input_client.model_files.digest` takes them."""
    if isinstance(tokenizer, HuggingFaceTokenizer):
        return {"tokenizer.json": tokenizer.spec.model, **tokenizer.sidecars}
    return {"": tokenizer.spec.model}


def info_of(tokenizer) -> IdsInfo:
    """`IdsInfo` of any kind's tokenizer (sentencepiece's from its processor)."""
    if isinstance(tokenizer, Tokenizer):
        sp = tokenizer.processor()
        return IdsInfo(sp.vocab_size(), sp.bos_id(), sp.eos_id(), sp.pad_id(), sp.unk_id())
    return tokenizer.info()
