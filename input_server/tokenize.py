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

    def to_element(self) -> dict[str, np.ndarray]:
        """A Grain element: a dict of arrays, which Grain's worker processes hand over through
        shared memory (a dataclass would be pickled through a pipe, and a group of several MB
        left in a pipe keeps a worker from exiting when its stream closes)."""
        return {"first_doc": np.int64(self.first_doc), "tokens": self.tokens,
                "lengths": self.lengths}

    @classmethod
    def from_element(cls, element: dict[str, np.ndarray]) -> TokenGroup:
        return cls(first_doc=int(element["first_doc"]), tokens=element["tokens"],
                   lengths=element["lengths"])


# A document that will be trimmed to `n` tokens is cut (at a space) before tokenizing:
# sentencepiece's time is per character, and a long document's tail would be thrown away. The
# cut keeps CUT_MARGIN times the characters that `n` tokens took on average in this process's
# earlier documents (starting from CUT_CHARS_PER_TOKEN), so the prefix almost always still
# holds `n` tokens; when it does not, the whole document is tokenized again. The cut only
# saves work: the tokens kept are the same either way.
CUT_CHARS_PER_TOKEN = 8.0
CUT_MARGIN = 1.5


class Tokenizer:
    """Encodes groups of documents with one sentencepiece batch call.

    Picklable: the model is loaded lazily in each process that encodes.
    """

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self._sp = None
        self.vocab_size = self.processor().vocab_size()
        self.word_local = self._pieces_are_word_local()
        self._chars_per_token = CUT_CHARS_PER_TOKEN / CUT_MARGIN

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

    def _pieces_are_word_local(self) -> bool:
        """True when no piece spans a word boundary (no "▁" after a piece's first
        character, sentencepiece's default `split_by_whitespace`): then the tokens of a text's
        whole words do not depend on the words after them, and a long text may be cut at a
        space before tokenizing without changing its first tokens."""
        sp = self.processor()
        return not any("▁" in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size()))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sp"] = None
        return state

    def encode(self, texts: list[str], first_doc: int = 0, num_threads: int = 1,
               trim_to: int | None = None) -> TokenGroup:
        """Tokenizes `texts` in one sentencepiece call, on `num_threads` of its C++ threads.

        The call holds the GIL, so Python threads calling it in parallel do not scale
        (measured: 1.0x with two); sentencepiece's own threads do.

        Args:
          trim_to: the packer keeps only this many tokens of a document; longer documents may
            come back trimmed (to at least `trim_to` tokens), never with other first tokens.
        """
        sp, add_bos, add_eos = self.processor(), self.spec.add_bos, self.spec.add_eos
        whole: dict[int, str] = {}  # documents cut short, by position
        if trim_to is not None and self.word_local:
            limit = int(trim_to * CUT_MARGIN * self._chars_per_token)
            for i, text in enumerate(texts):
                if len(text) > limit:
                    space = text.rfind(" ", 0, limit)
                    if space > 0:
                        if not whole:
                            texts = list(texts)
                        whole[i] = text
                        texts[i] = text[:space]
        ids = sp.encode(texts, out_type=int, add_bos=add_bos, add_eos=add_eos,
                        num_threads=num_threads)
        if trim_to is not None:
            # Learn this data's characters per token from the documents tokenized whole.
            chars = sum(len(t) for i, t in enumerate(texts) if i not in whole)
            tokens = sum(len(x) for i, x in enumerate(ids) if i not in whole)
            if tokens > 1000:
                self._chars_per_token = 0.8 * self._chars_per_token + 0.2 * chars / tokens
        for i, text in whole.items():
            # Enough whole-word tokens: the first `trim_to` are the full text's (an EOS, if
            # any, is last and falls past them). Too few: tokenize the whole text after all.
            if len(ids[i]) > trim_to:
                ids[i] = ids[i][:trim_to]
            else:
                ids[i] = sp.encode(text, out_type=int, add_bos=add_bos, add_eos=add_eos)
        return self._group(ids, first_doc)

    @staticmethod
    def _group(ids: list[list[int]], first_doc: int) -> TokenGroup:
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                             count=int(lengths.sum()))
        return TokenGroup(first_doc=first_doc, tokens=tokens, lengths=lengths)
