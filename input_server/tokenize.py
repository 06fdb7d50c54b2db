"""Sentencepiece tokenization of document groups into one flat token array per group."""

from __future__ import annotations

import dataclasses
import itertools
import os

import numpy as np

from input_client.spec import TokenizerSpec
from input_server.errors import DataNotFoundError, InvalidSpecError


@dataclasses.dataclass(frozen=True)
class TokenGroup:
    """The tokens of consecutive documents: `tokens[starts[i]:starts[i] + lengths[i]]` is doc i.

    `first_doc` is the ordinal of doc 0 in the stream, used to resume mid-group.
    """

    first_doc: int
    tokens: np.ndarray  # int32, all documents concatenated
    lengths: np.ndarray  # int64, tokens per document

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths


class Tokenizer:
    """Encodes groups of documents with one sentencepiece batch call (it releases the GIL).

    Picklable: the model is loaded lazily in each process that encodes.
    """

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self._sp = None
        self.vocab_size = self.processor().vocab_size()

    def processor(self):
        if self._sp is None:
            import sentencepiece as spm

            if not os.path.isfile(self.spec.model):
                raise DataNotFoundError(f"`tokenizer.model`: no such file {self.spec.model!r}.")
            sp = spm.SentencePieceProcessor()
            try:
                sp.Load(self.spec.model)
            except (OSError, RuntimeError) as e:
                raise InvalidSpecError(f"`tokenizer.model` {self.spec.model!r} is not a "
                                       f"sentencepiece model ({e}).") from e
            self._sp = sp
        return self._sp

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sp"] = None
        return state

    def encode(self, texts: list[str], first_doc: int = 0, num_threads: int = 1) -> TokenGroup:
        """Tokenizes `texts` in one sentencepiece call, on `num_threads` of its C++ threads.

        The call holds the GIL, so Python threads calling it in parallel do not scale
        (measured: 1.0x with two); sentencepiece's own threads do.
        """
        ids = self.processor().encode(texts, out_type=int, add_bos=self.spec.add_bos,
                                      add_eos=self.spec.add_eos, num_threads=num_threads)
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                             count=int(lengths.sum()))
        return TokenGroup(first_doc=first_doc, tokens=tokens, lengths=lengths)
