"""Sentencepiece models, tokenized a group of documents per batch call, long documents cut
before tokenizing (the pieces of most models never span a space)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from input_server.data.tokenizers.base import IdsInfo, LimitCall, ModelTokenizer
from input_server.data.tokenizers.checks import (
    MAX_NORMALIZER_EXPANSION,
    charsmap_expansion,
    check_readable,
    expansion_refusal,
    kind_hint,
    model_faults,
    refuse_tekken,
)
from input_server.data.tokenizers.groups import Cutter
from input_server.errors import InvalidSpecError, shorten


class SentencepieceTokenizer(ModelTokenizer):
    """A sentencepiece model (`tokenizer.model`, the default kind), as MaxText's
    `SentencePieceTokenizer` tokenizes with it.

    Args:
      spec: the tokenizer, its `model` the path to open (resolved inside the data roots).
      written: the model's path as the client wrote it, which messages name (a resolved path
        would tell the client where links lead); default `spec.model`.
    """

    KIND = "sentencepiece"
    LIBRARY = "sentencepiece"
    REFERENCE = (
        "SentencePieceProcessor.encode(text) per document, as MaxText's SentencePieceTokenizer"
    )
    # A model peaked at 11.6 x its bytes loaded (measured while writing this: a 20 MB model of
    # 1 M pieces, 147 MB loaded plus 87 MB for the ModelProto parsed here); real ones are a few
    # MB (Gemma 3's 262,144 pieces: 4.7 MB).
    MAX_FILE_BYTES = 128 << 20

    def __init__(self, spec, **kw):
        super().__init__(spec, **kw)
        # A damaged model may fail anywhere its pieces are read (a piece that is not UTF-8
        # raised UnicodeDecodeError here): the model's fault, named, not INTERNAL.
        with model_faults(self.written, "reading its pieces"):
            self.word_local = self._pieces_are_word_local()
            self.extendable = self.word_local and self._text_after_a_space_tokenizes_alike()
        if self.word_local:
            self.cutter = Cutter(
                extendable=self.extendable,
                bos=spec.add_bos,
                eos=spec.add_eos,
                eos_id=self.model().eos_id(),
            )

    BACKENDS = ("kitoken",)

    def not_tried(self, name: str) -> str | None:
        from sentencepiece import sentencepiece_model_pb2 as pb2

        if self._proto().trainer_spec.model_type != pb2.TrainerSpec.UNIGRAM:
            return None
        return (
            f"{name} is not tried on unigram models (it differed from sentencepiece on every "
            "unigram model measured: equal-score ties broken otherwise, byte fallback, nmt rules)"
        )

    def _proto(self):
        from sentencepiece import sentencepiece_model_pb2

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(self.model().serialized_model_proto())
        return model

    def load_backend(self, name: str):
        from input_server.data.tokenizers.fast import Kitoken

        self.model()  # its checks first
        return Kitoken(self.spec.model)

    def _load(self):
        import sentencepiece as spm

        check_readable(self.spec.model, self.written)  # sentencepiece says only "not found"
        refuse_tekken(self.spec.model, self.written, self.KIND)
        sp = spm.SentencePieceProcessor()
        try:
            sp.Load(self.spec.model)
        except (OSError, RuntimeError) as e:
            why = str(e).replace(self.spec.model, self.written)
            hint = kind_hint(self.spec.model, "sentencepiece")
            raise InvalidSpecError(
                f"`tokenizer.model` {shorten(self.written)!r} is not a sentencepiece model "
                f"({why}){hint}."
            ) from e
        self._check_normalizers(sp)
        return sp

    def info(self) -> IdsInfo:
        sp = self.model()
        return IdsInfo(sp.vocab_size(), sp.bos_id(), sp.eos_id(), sp.pad_id(), sp.unk_id())

    def _encode(self, texts: list[str], *, add_bos: bool, add_eos: bool) -> list[np.ndarray]:
        """One sentencepiece batch call on one of its C++ threads (it releases the GIL: two
        Python threads encoding at once ran 1.76-1.83x as fast as one), as numpy arrays: no
        Python int is made per token, 1.26-1.40x as fast as lists of ints once flattened
        (scripts/bench/bench_tokenize.py)."""
        return self.model().encode(
            texts, add_bos=add_bos, add_eos=add_eos, num_threads=1, return_type="numpy"
        )

    def limit_calls(self, threads: int) -> dict[str, LimitCall]:
        sp, spec = self.model(), self.spec

        def batch(texts):
            ids = sp.encode(
                texts,
                add_bos=spec.add_bos,
                add_eos=spec.add_eos,
                num_threads=threads,
                return_type="numpy",
            )
            return [len(x) for x in ids]

        return {"SentencePieceProcessor.encode(batch, numpy)": batch}

    def maxtext_encoder(self) -> Callable[[str], list[int]]:
        sp, spec = self.model(), self.spec
        return lambda text: sp.encode(text, add_bos=spec.add_bos, add_eos=spec.add_eos)

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
        sp = self.model()
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

        model = self._proto()
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
        """The margin its cuts keep (groups.CUT_MARGIN_*); 1 for a model that is not cut."""
        return self.cutter.margin if self.cutter is not None else 1.0
