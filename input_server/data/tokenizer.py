"""Sentencepiece tokenization of document groups into one flat token array per group."""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from input_client.spec import TokenizerSpec
from input_server.data.model_checks import (
    MAX_NORMALIZER_EXPANSION,
    charsmap_expansion,
    expansion_refusal,
    kind_hint,
    model_faults,
)
from input_server.errors import DataNotFoundError, InvalidSpecError, UnreadableError, shorten


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
        return {
            "first_doc": np.int64(self.first_doc),
            "tokens": self.tokens,
            "lengths": self.lengths,
        }

    @classmethod
    def from_element(cls, element: dict[str, np.ndarray]) -> TokenGroup:
        return cls(
            first_doc=int(element["first_doc"]),
            tokens=element["tokens"],
            lengths=element["lengths"],
        )


def group_of(ids: list[np.ndarray], first_doc: int, trim_to: int | None) -> TokenGroup:
    """The group of documents whose int32 ids are `ids`, each trimmed to `trim_to` tokens."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if trim_to is not None:
        for i in np.flatnonzero(lengths > trim_to).tolist():
            ids[i] = ids[i][:trim_to]
        np.minimum(lengths, trim_to, out=lengths)
    tokens = np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, np.int32)
    return TokenGroup(first_doc=first_doc, tokens=tokens, lengths=lengths)


# A document that will be trimmed to `n` tokens is cut (at a space) before tokenizing:
# sentencepiece's time is per character, and a long document's tail would be thrown away. The
# cut keeps a margin times the characters that `n` tokens took on average (learned from a
# sample of the data, then from every group; CUT_CHARS_PER_TOKEN before any). A prefix that
# proves to hold too few tokens grows at a further space, sized from its own characters per
# token. The cut only saves work: the tokens kept are the same either way.
# Growing by tokenizing only the added text (BPE, word and char models) is cheap, so a small
# margin pays; growing by tokenizing the longer prefix again (unigram models) costs more per
# miss. Each margin tokenized the fewest characters per epoch of pydoc topics in a sweep done
# while writing this (scripts/bench_tokenize.py reports the characters tokenized).
CUT_CHARS_PER_TOKEN = 8.0
CUT_MARGIN_GROW_ADDED = 1.05
CUT_MARGIN_RETOKENIZE = 1.25


class Tokenizer:
    """Encodes groups of documents with one sentencepiece batch call.

    Picklable: the model is loaded lazily in each process that encodes.

    Args:
      spec: the tokenizer, its `model` the path to open (resolved inside the data roots).
      written: the model's path as the client wrote it, which messages name (a resolved path
        would tell the client where links lead); default `spec.model`.
    """

    def __init__(self, spec: TokenizerSpec, *, written: str | None = None):
        self.spec = spec
        self.written = spec.model if written is None else written
        self._sp = None
        self.vocab_size = self.processor().vocab_size()
        # A damaged model may fail anywhere its pieces are read (a piece that is not UTF-8
        # raised UnicodeDecodeError here): the model's fault, named, not INTERNAL.
        with model_faults(self.written, "reading its pieces"):
            self.word_local = self._pieces_are_word_local()
            self.extendable = self.word_local and self._text_after_a_space_tokenizes_alike()
        self._chars_per_token = CUT_CHARS_PER_TOKEN
        self._groups_learned = 0

    def processor(self):
        if self._sp is None:
            import sentencepiece as spm

            shown = shorten(self.written)
            if not os.path.isfile(self.spec.model):
                raise DataNotFoundError(f"`tokenizer.model`: no such file {shown!r}.")
            try:
                open(self.spec.model, "rb").close()  # sentencepiece says only "not found"
            except PermissionError as e:
                raise UnreadableError(
                    f"`tokenizer.model`: the server may not read {shown!r} (permission denied)."
                ) from e
            sp = spm.SentencePieceProcessor()
            with model_faults(self.written, "loading"):
                try:
                    sp.Load(self.spec.model)
                except (OSError, RuntimeError) as e:
                    why = str(e).replace(self.spec.model, self.written)
                    hint = kind_hint(self.spec.model, "sentencepiece")
                    raise InvalidSpecError(
                        f"`tokenizer.model` {shown!r} is not a sentencepiece model ({why}){hint}."
                    ) from e
                self._check_normalizers(sp)
            self._sp = sp
        return self._sp

    def _check_normalizers(self, sp) -> None:
        """Refuses a model whose normalizer (or denormalizer) charsmap could multiply a
        document's length past MAX_NORMALIZER_EXPANSION, before any document is normalized."""
        from sentencepiece import sentencepiece_model_pb2

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(sp.serialized_model_proto())
        for where, norm in (
            ("normalizer", model.normalizer_spec),
            ("denormalizer", model.denormalizer_spec),
        ):
            factor = charsmap_expansion(norm.precompiled_charsmap)
            if factor > MAX_NORMALIZER_EXPANSION:
                raise expansion_refusal(self.written, factor, f"{where} (precompiled charsmap)")

    def _pieces_are_word_local(self) -> bool:
        """True when no piece spans a word boundary (no "▁" after a piece's first
        character, sentencepiece's default `split_by_whitespace`): then the tokens of a text's
        whole words do not depend on the words after them, and a long text may be cut at a
        space before tokenizing without changing its first tokens."""
        sp = self.processor()
        return not any("▁" in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size()))

    def _text_after_a_space_tokenizes_alike(self) -> bool:
        """True when the text after a space, tokenized alone, gives the tokens it has inside
        the whole text (given word-local pieces): the normalizer strips the leading space and
        adds the "▁" the space would have become (sentencepiece's defaults), and the model
        segments each word on its own. Then a prefix that proved too short is grown by
        tokenizing only what follows it.

        Not unigram models: their Viterbi search breaks exact ties between segmentations by
        floating-point sums from the text's start, so a word's tokens can depend on the text
        before it (found by review: " ***************" became "▁** ** ***********" after one
        prefix and "▁** *********** **" after another). BPE merges, word and char models never
        look across a "▁".
        """
        from sentencepiece import sentencepiece_model_pb2

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(self.processor().serialized_model_proto())
        norm, trainer = model.normalizer_spec, model.trainer_spec
        return bool(
            trainer.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM
            and norm.add_dummy_prefix
            and norm.remove_extra_whitespaces
            and norm.escape_whitespaces
            and not trainer.treat_whitespace_as_suffix
        )

    @property
    def cut_margin(self) -> float:
        return CUT_MARGIN_GROW_ADDED if self.extendable else CUT_MARGIN_RETOKENIZE

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sp"] = None
        return state

    def learn_chars_per_token(self, texts: list[str]) -> float:
        """Tokenizes a sample of the data to learn its characters per token (pickled with the
        tokenizer, so worker processes start from it rather than CUT_CHARS_PER_TOKEN)."""
        sp = self.processor()
        with model_faults(self.written, "tokenizing"):
            ids = sp.encode(
                texts, add_bos=self.spec.add_bos, add_eos=self.spec.add_eos, return_type="numpy"
            )
        self._learn(texts, ids)
        return self._chars_per_token

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        """About how many of a document's `text_chars` characters get tokenized when the
        packer keeps `trim_to` of its tokens (see CUT_MARGIN_*)."""
        if trim_to is None or not self.word_local:
            return text_chars
        return min(text_chars, int(trim_to * self.cut_margin * self._chars_per_token))

    def encode(
        self, texts: list[str], first_doc: int = 0, num_threads: int = 1, trim_to: int | None = None
    ) -> TokenGroup:
        """Tokenizes `texts` in one sentencepiece call, on `num_threads` of its C++ threads.

        Tokens come back as numpy arrays (sentencepiece's `return_type="numpy"`): no Python
        int is made per token, 1.26-1.40x as fast as lists of ints once flattened. The call
        releases the GIL (two Python threads encoding at once ran 1.76-1.83x as fast as one),
        so Grain's threads tokenize in parallel (scripts/bench_tokenize.py).

        Args:
          trim_to: the packer keeps only this many tokens of a document; documents longer than
            that come back trimmed to exactly `trim_to` tokens, their first ones.
        """
        encode = functools.partial(
            self.processor().encode,
            add_bos=self.spec.add_bos,
            add_eos=self.spec.add_eos,
            num_threads=num_threads,
            return_type="numpy",
        )
        with model_faults(self.written, "tokenizing"):
            if trim_to is None or not self.word_local:
                ids = encode(texts)
            else:
                ids = self._encode_cut(encode, texts, trim_to)
        return group_of(ids, first_doc, trim_to)

    def _learn(self, texts: list[str], ids: list[np.ndarray]) -> None:
        """Folds this group's characters per token into the running estimate."""
        specials = int(self.spec.add_bos) + int(self.spec.add_eos)
        tokens = sum(map(len, ids)) - specials * len(ids)
        if tokens > 1000:
            self._groups_learned += 1
            w = max(0.2, 1 / self._groups_learned)
            self._chars_per_token += w * (sum(map(len, texts)) / tokens - self._chars_per_token)

    def _encode_cut(self, encode, texts: list[str], trim_to: int) -> list[np.ndarray]:
        """Encodes `texts`, each long one cut at a space first (see CUT_MARGIN_*). A prefix that
        proves to hold fewer than `trim_to` tokens grows, at a further space, until it holds
        enough or the document is whole: only the added text is tokenized when the model
        allows it (`self.extendable`), else the longer prefix is tokenized again."""
        limit = int(trim_to * self.cut_margin * self._chars_per_token)
        work = list(texts)
        ends: dict[int, int] = {}  # documents cut short: where their tokenized text ends
        for i, text in enumerate(texts):
            if len(text) > limit:
                space = text.rfind(" ", 0, limit)
                if space > 0:
                    work[i], ends[i] = text[:space], space
        ids = encode(work)
        self._learn(work, ids)
        if not ends:
            return ids
        bos, eos = int(self.spec.add_bos), int(self.spec.add_eos)
        eos_id = self.processor().eos_id()
        # A cut document's tokens so far, without the EOS its prefix was given: all of them
        # are the whole document's first tokens.
        body = {i: ids[i][: len(ids[i]) - eos] for i in ends}
        short = [i for i in ends if len(body[i]) < trim_to]
        while short:
            pieces = []
            for i in short:
                text, start = texts[i], ends[i]
                # Characters for the missing tokens at this prefix's own rate, with margin.
                rate = start / max(1, len(body[i]) - bos)
                end = start + max(64, int((trim_to - len(body[i])) * self.cut_margin * rate))
                if end < len(text):
                    space = text.rfind(" ", start + 1, end)
                    end = space if space > start else text.find(" ", end)
                ends[i] = end = len(text) if end < 0 or end >= len(text) else end
                pieces.append(text[start:end] if self.extendable else text[:end])
            add_bos = bool(bos) and not self.extendable
            for i, x in zip(short, encode(pieces, add_bos=add_bos, add_eos=False), strict=True):
                body[i] = np.concatenate([body[i], x]) if self.extendable else x
            short = [i for i in short if len(body[i]) < trim_to and ends[i] < len(texts[i])]
        for i, b in body.items():
            ids[i] = np.append(b, np.int32(eos_id)) if eos and ends[i] == len(texts[i]) else b
        return ids
