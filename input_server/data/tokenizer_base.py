"""What every tokenizer kind reports (`IdsInfo`), and what the kinds other than sentencepiece
share (`WholeDocumentTokenizer`)."""

from __future__ import annotations

import dataclasses
import os

from input_client.spec import TokenizerSpec
from input_server.data.model_checks import model_faults
from input_server.data.tokenizer import CUT_CHARS_PER_TOKEN, TokenGroup, group_of
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
            with model_faults(self.written, "loading"):
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
        self.model()  # its own faults say "loading"
        with model_faults(self.written, "tokenizing"):
            ids = self._encode(texts)
        return group_of(ids, first_doc, trim_to)
