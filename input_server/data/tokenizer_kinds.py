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

import numpy as np

from input_client.spec import TokenizerSpec
from input_server.data.tokenizer import CUT_CHARS_PER_TOKEN, TokenGroup, Tokenizer, group_of
from input_server.errors import DataNotFoundError, UnreadableError, shorten


@dataclasses.dataclass(frozen=True)
class IdsInfo:
    """A model's vocabulary and special ids; -1 where the model has no such token."""

    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int


class WholeDocumentTokenizer:
    """What the kinds other than sentencepiece share: documents are tokenized whole (no cut
    before tokenizing: their pieces may span spaces), then trimmed; subclasses give
    `_load()`, `_encode(texts)` (arrays with BOS/EOS) and `info()`.

    Picklable: the model is loaded lazily in each process that encodes.
    """

    word_local = False
    extendable = False
    cut_margin = 1.0

    def __init__(self, spec: TokenizerSpec, *, written: str | None = None):
        self.spec = spec
        self.written = spec.model if written is None else written
        self._model = None
        self.vocab_size = self.info().vocab_size

    def model(self):
        if self._model is None:
            self._model = self._load()
        return self._model

    def _open_check(self, path: str, key: str = "tokenizer.model") -> None:
        """Missing and unreadable files named as sentencepiece's are."""
        shown = shorten(self.written)
        if not os.path.isfile(path):
            raise DataNotFoundError(f"`{key}`: no such file {shown!r}.")
        try:
            open(path, "rb").close()
        except PermissionError as e:
            raise UnreadableError(
                f"`{key}`: the server may not read {shown!r} (permission denied)."
            ) from e

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_model"] = None
        return state

    def learn_chars_per_token(self, texts: list[str]) -> float:
        return CUT_CHARS_PER_TOKEN

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        return text_chars

    def encode(
        self, texts: list[str], first_doc: int = 0, num_threads: int = 1, trim_to: int | None = None
    ) -> TokenGroup:
        """Tokenizes `texts` whole (`num_threads` is sentencepiece's; the others parallelize
        across Grain's threads); documents longer than `trim_to` keep their first tokens."""
        return group_of(self._encode(texts), first_doc, trim_to)


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
        from input_server.data.hf_tokenizer import HuggingFaceTokenizer

        return HuggingFaceTokenizer(spec, written=written, config=config)
    if spec.kind == "tiktoken":
        from input_server.data.tiktoken_tokenizer import TiktokenTokenizer

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


def as_int32(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)
