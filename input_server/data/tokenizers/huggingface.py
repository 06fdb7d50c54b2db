"""Hugging Face tokenizers (`tokenizer.json`), tokenized as MaxText 0.2.5's `HFTokenizer` does,
with the Rust `tokenizers` library alone (no transformers).

MaxText loads `transformers.AutoTokenizer.from_pretrained(path, add_bos_token=add_bos,
add_eos_token=add_eos)`. Given those two arguments, transformers (5.x, `TokenizersBackend`)
replaces the file's post-processor with `[BOS] $A [EOS]` as the flags say (BOS and EOS being
`tokenizer_config.json`'s `bos_token`/`eos_token`; a flag whose token is unset adds nothing),
and adds the config's named special tokens to the vocabulary as special tokens if the file
lacks them. A model-specific `tokenizer_class` (Qwen2Tokenizer, ...) is taken where what
transformers builds for it is the file's own pipeline, with that class's default named tokens
(`hf_config`). `encode(text)` then applies the whole `tokenizer.json` pipeline (normalizer,
pre-tokenizer, model, special tokens found in the text). The same is done here, and a group is
one `encode_batch_fast` call, which releases the GIL.

A `tokenizer.json` that pads or truncates is refused: transformers would apply either to each
document, and padding differs between one document and a batch.

Loaded models are shared within a process (`_LOADED`): with `tokenizers` 0.23 every `Tokenizer`
that has encoded keeps ~0.75 MB after it is dropped (400 loads of a 1,000-token model: +300 MB),
so loading per stream would grow the server. One entry per set of files, BOS/EOS added per use
(a copy per flag pair took 1.5 GB each for a 110 MB file), bounded by estimated size too.
Long documents are cut before tokenizing where `word_cuts` proves the ids the same.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from collections.abc import Callable

import numpy as np

from input_client.model_files import HF_FILES
from input_server.data.tokenizers.base import IdsInfo, LimitCall, ModelTokenizer, over_slices
from input_server.data.tokenizers.checks import (
    MAX_NORMALIZER_EXPANSION,
    bounded,
    check_readable,
    expansion_refusal,
    file_identity,
    hf_member_expansion,
    hf_normalizer_expansion,
    kind_hint,
    model_faults,
    refuse_tekken,
)
from input_server.data.tokenizers.groups import Cutter
from input_server.data.tokenizers.hf_config import named_tokens
from input_server.data.tokenizers.normalizer_probe import MAX_MEASURED_PRODUCT, measured_expansion
from input_server.data.tokenizers.word_cuts import LETTER_SPACES, between_letters, cuts_at_words
from input_server.errors import DataNotFoundError, InvalidSpecError, UnreadableError, shorten

log = logging.getLogger(__name__)

# Loaded tokenizers by their files' identity, least recent first: (tokenizer, ids, bytes).
_LOADED: collections.OrderedDict = collections.OrderedDict()
_LOADED_LOCK = threading.Lock()
MAX_LOADED = 8
# A loaded tokenizer.json takes 10-15 x its file (1.5 GB for a 110 MB file; fastokens' copy is
# apart, `fast.FASTOKENS_BYTES_PER_FILE_BYTE`); the estimate errs above it.
LOAD_BYTES_PER_FILE_BYTE = 16
# What the loaded models may take together, by that estimate: older ones are dropped past it
# (a model still used by a stream stays alive through it, then goes).
MAX_LOADED_BYTES = 2 << 30
# The most a tokenizer_config.json or special_tokens_map.json may hold (real ones: a few KB).
MAX_CONFIG_BYTES = 16 << 20
# (model, flag) pairs already warned of: a client describing a model over and over must not
# grow the log by a line a call.
_WARNED: set = set()


class HuggingFaceTokenizer(ModelTokenizer):
    """A `tokenizer.json` with the named tokens of the `tokenizer_config.json` beside it.

    `sidecars`: the files beside it that exist and may be read (`tokenizer_config.json`,
    `special_tokens_map.json`; `resolve` finds them)."""

    KIND = "huggingface"
    LIBRARY = "tokenizers"
    REFERENCE = (
        "tokenizers.Tokenizer.encode(text).ids per document with the same post-processor; "
        "MaxText calls transformers' AutoTokenizer.encode, whose Python overhead (not installed "
        "here) this leaves out, so it flatters the reference"
    )
    # A file may hold what fills the loaded-model budget, at about 14 x its bytes loaded.
    MAX_FILE_BYTES = MAX_LOADED_BYTES // LOAD_BYTES_PER_FILE_BYTE

    def __init__(self, spec, **kw):
        super().__init__(spec, **kw)
        if cuts_at_words(self.model()):  # cut at a space between letters; the rest alike alone
            i = self.info()
            b, e = spec.add_bos and i.bos_id >= 0, spec.add_eos and i.eos_id >= 0
            self.cutter = Cutter(
                extendable=True,
                bos=b,
                eos=e,
                eos_id=i.eos_id,
                at=between_letters,
                places=LETTER_SPACES,
            )

    @classmethod
    def process_bytes(cls, file_bytes: int) -> int:
        """A worker process's copy by the reference's estimate (LOAD_BYTES_PER_FILE_BYTE): a
        118 MB tokenizer.json takes ~1.9 GB a process. The server's own copy is shared by its
        streams and bounded apart (MAX_LOADED_BYTES)."""
        return file_bytes * LOAD_BYTES_PER_FILE_BYTE

    @classmethod
    def resolve(cls, access, spec) -> tuple[str, dict[str, str]]:
        """The tokenizer.json (`model` is the file itself, or the folder holding it, as
        MaxText's `tokenizer_path` is) and the files beside it that name its tokens
        (`input_client.model_files.HF_FILES`), those that exist, inside the data roots."""
        model = _json_file(access, spec.model)
        try:
            found = access.file(model, "tokenizer.model")
        except DataNotFoundError as e:
            raise DataNotFoundError(
                f"{str(e).rstrip('.')}: a Hugging Face `tokenizer.model` is the folder holding "
                f"tokenizer.json (as MaxText's `tokenizer_path`) or the tokenizer.json file "
                f"itself."
            ) from None
        why = (
            f" (loaded, it would take about {LOAD_BYTES_PER_FILE_BYTE} x that, past the "
            f"{MAX_LOADED_BYTES >> 20} MB the server gives loaded models)"
        )
        path = bounded(found, cls.MAX_FILE_BYTES, model, why)
        sidecars = {}
        for name in HF_FILES[1:]:
            written = os.path.join(os.path.dirname(model), name)
            try:
                found = access.file(written, "tokenizer.model")
            except DataNotFoundError:
                continue
            if os.path.isfile(found):  # the operator's own tools see every path
                sidecars[name] = bounded(found, MAX_CONFIG_BYTES, written)
        return path, sidecars

    def files(self) -> dict[str, str]:
        return {"tokenizer.json": self.spec.model, **self.sidecars}

    def _folder(self) -> str:
        """The folder of the model as written: `model` names the folder, or the file itself
        (a name ending in .json, or a file not named tokenizer.json)."""
        names_file = self.written.endswith(".json") or (
            os.path.basename(self.spec.model) != "tokenizer.json"
        )
        return os.path.dirname(self.written) if names_file else self.written

    def _json(self, name: str) -> dict:
        if name not in self.sidecars:
            return {}
        folder = self._folder()
        shown = shorten(os.path.join(folder, name))
        try:
            with open(self.sidecars[name], encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, ValueError, RecursionError) as e:
            raise InvalidSpecError(
                f"`tokenizer.model`: {shown!r} is not a readable JSON file ({e})."
            ) from None
        if not isinstance(value, dict):
            raise InvalidSpecError(f"`tokenizer.model`: {shown!r} is not a JSON object.")
        return value

    def _refuse(self, why: str) -> InvalidSpecError:
        return InvalidSpecError(f"`tokenizer.model` {shorten(self.written)!r}: {why}.")

    def _named(self, tok) -> tuple[dict[str, str | None], list[str]]:
        """The named and extra special tokens, as transformers reads the config for its
        `tokenizer_class` (`hf_config`), refusing what it would read otherwise."""
        config, mapped = self._json("tokenizer_config.json"), self._json("special_tokens_map.json")
        try:
            return named_tokens(config, mapped, tok)
        except ValueError as e:
            raise self._refuse(str(e)) from None

    def _load(self):
        check_readable(self.spec.model, self.written)
        key = (
            file_identity(self.spec.model),
            *sorted((n, file_identity(p)) for n, p in self.sidecars.items()),
        )
        with _LOADED_LOCK:
            hit = _LOADED.get(key)
            if hit is not None:
                _LOADED.move_to_end(key)
        if hit is not None:
            tok, self._ids, _ = hit
            self._warn_unset()
            return tok
        try:
            tok = self._build()
        except InvalidSpecError:
            raise
        except Exception as e:  # the Rust side raises plain Exception (e.g. a bad template)
            raise self._refuse(f"not a usable Hugging Face tokenizer ({e})") from None
        size = LOAD_BYTES_PER_FILE_BYTE * sum(
            os.path.getsize(p) for p in (self.spec.model, *self.sidecars.values())
        )
        with _LOADED_LOCK:
            _LOADED[key] = (tok, self._ids, size)
            while len(_LOADED) > 1 and (
                len(_LOADED) > MAX_LOADED or sum(e[2] for e in _LOADED.values()) > MAX_LOADED_BYTES
            ):
                _LOADED.popitem(last=False)
        self._warn_unset()
        return tok

    def _warn_unset(self) -> None:
        """A flag whose token the model does not name adds nothing, as MaxText's
        `AutoTokenizer.from_pretrained(add_bos_token=...)` adds nothing (a bare tokenizer.json
        without tokenizer_config.json names no BOS): said in the log, naming the model, since
        a trainer expecting a BOS gets none."""
        spec = self.spec
        for on, flag, key in (
            (spec.add_bos, "add_bos", "bos_token"),
            (spec.add_eos, "add_eos", "eos_token"),
        ):
            if on and self._ids[key] < 0:
                with _LOADED_LOCK:
                    if (self.spec.model, flag) in _WARNED:
                        continue
                    if len(_WARNED) > 4096:
                        _WARNED.clear()
                    _WARNED.add((self.spec.model, flag))
                log.warning(
                    "`tokenizer.model` %r: `%s = true` adds nothing: the model names no %s "
                    "(no tokenizer_config.json beside its tokenizer.json, or none set there), "
                    "as with MaxText's Hugging Face tokenizer; add a tokenizer_config.json "
                    "naming it to get one.",
                    shorten(self.written),
                    flag,
                    key,
                )

    def _build(self):
        # One core per call: parallelism is Grain's threads and processes, which the tuner
        # counts; tokenizers' own Rayon pool would spread every call over all the host's
        # cores (CPU time 1.47 x wall measured on 2 cores) behind the tuner's back. An
        # operator's own setting stands.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from tokenizers import AddedToken, Tokenizer, processors

        refuse_tekken(self.spec.model, self.written, self.KIND)
        try:
            tok = Tokenizer.from_file(self.spec.model)
        except Exception as e:  # the Rust side raises plain Exception for a bad file
            hint = kind_hint(self.spec.model, "huggingface")
            raise self._refuse(f"not a Hugging Face tokenizer.json ({e}){hint}") from None
        self._check_normalizer(tok)
        for what, on in (("padding", tok.padding), ("truncation", tok.truncation)):
            if on:
                raise self._refuse(
                    f"its tokenizer.json sets {what} ({on}); the server packs whole documents: "
                    f"save it with {what} off"
                )
        named, extra = self._named(tok)
        have = {t.content for t in tok.get_added_tokens_decoder().values()}
        missing = [t for t in [*named.values(), *extra] if t is not None and t not in have]
        if missing:  # as transformers adds them
            missing = list(dict.fromkeys(missing))
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
        # transformers replaces the file's post-processor by `[BOS] $A [EOS]` as the flags say;
        # the BOS and EOS are added per use (`_encode`), so one loaded copy serves every flag.
        tok.post_processor = processors.TemplateProcessing(
            single="$A:0", pair="$A:0 $B:1", special_tokens=[]
        )
        self._ids = {k: -1 if t is None else tok.token_to_id(t) for k, t in named.items()}
        return tok

    def _check_normalizer(self, tok) -> None:
        """Refuses a normalizer that could multiply a document's length past
        MAX_NORMALIZER_EXPANSION (measured: one replacing each space with 100,000 characters
        OOM-killed a 3 GB server in 7.7 s), from its description, before any text meets it."""
        if tok.normalizer is None:
            return
        try:
            node = json.loads(tok.normalizer.__getstate__())
            factor = hf_normalizer_expansion(node)
            member = hf_member_expansion(node)
        except ValueError as e:
            raise self._refuse(f"its normalizer cannot be bounded ({e})") from None
        if factor <= MAX_NORMALIZER_EXPANSION:
            return
        # The product of loose per-member bounds refuses real chains (ALBERT's scores 1,944):
        # one member past the limit is refused as it stands, a product within
        # MAX_MEASURED_PRODUCT is measured on the loaded normalizer (under 1 s).
        if member > MAX_NORMALIZER_EXPANSION:
            raise expansion_refusal(self.written, member, "normalizer")
        if factor > MAX_MEASURED_PRODUCT:
            raise expansion_refusal(self.written, factor, "normalizer (its members' product)")
        with model_faults(self.written, "measuring its normalizer"):
            seen = measured_expansion(tok.normalizer.normalize_str, node, factor)
        if seen > MAX_NORMALIZER_EXPANSION:
            raise expansion_refusal(self.written, seen, "normalizer (measured)")

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

    def ends(
        self, add_bos: bool | None = None, add_eos: bool | None = None
    ) -> tuple[list[int], list[int]]:
        """The ids put before and after each document's own (BOS, EOS as the flags say, the
        spec's by default, and the model names them): the loaded model, shared by every flag
        pair, adds none."""
        self.model()
        add_bos = self.spec.add_bos if add_bos is None else add_bos
        add_eos = self.spec.add_eos if add_eos is None else add_eos
        bos, eos = self._ids["bos_token"], self._ids["eos_token"]
        head = [bos] if add_bos and bos >= 0 else []
        tail = [eos] if add_eos and eos >= 0 else []
        return head, tail

    BACKENDS = ("fastokens",)

    def load_backend(self, name: str):
        from input_server.data.tokenizers.fast import Fastokens, check_fastokens_fits

        size, tok = os.path.getsize(self.spec.model), self.model()  # estimated before it loads
        fits = (self.written, size, tok.get_vocab_size(), LOAD_BYTES_PER_FILE_BYTE * size)
        check_fastokens_fits(*fits, MAX_LOADED_BYTES)  # as loaded: added specials, no BOS/EOS
        return Fastokens.from_json(tok.to_str())

    def _encode(self, texts: list[str], *, add_bos: bool, add_eos: bool) -> list[np.ndarray]:
        encodings = self.model().encode_batch_fast(texts, add_special_tokens=True)
        head, tail = self.ends(add_bos, add_eos)
        if not head and not tail:
            return [np.asarray(e.ids, dtype=np.int32) for e in encodings]
        return [np.asarray([*head, *e.ids, *tail], dtype=np.int32) for e in encodings]

    def limit_calls(self, threads: int) -> dict[str, LimitCall]:
        tok = self.model()
        extra = sum(map(len, self.ends()))

        # Rayon's threads: all cores, unless TOKENIZERS_PARALLELISM=false, which the loader
        # sets (the server's parallelism is Grain's threads); then threads over slices.
        def batch(texts):
            return [len(e) + extra for e in tok.encode_batch_fast(texts, add_special_tokens=True)]

        return {
            "Tokenizer.encode_batch_fast": batch,
            f"{threads} threads x Tokenizer.encode_batch_fast": over_slices(batch, threads),
        }

    def maxtext_encoder(self) -> Callable[[str], list[int]]:
        # transformers' encode: [BOS] $A [EOS] as the flags say (its post-processor).
        tok, (head, tail) = self.model(), self.ends()
        return lambda text: [*head, *tok.encode(text).ids, *tail]

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_ids", None)
        return state


def _json_file(access, model: str) -> str:
    """A Hugging Face `model` as written: the tokenizer.json itself (a name ending in .json,
    or a regular file of another name), else the folder holding it."""
    if model.endswith(".json"):
        return model
    try:
        found = access.file(model, "tokenizer.model")
    except (DataNotFoundError, UnreadableError):  # a folder, or nothing: the folder's file
        return os.path.join(model, "tokenizer.json")
    return model if os.path.isfile(found) else os.path.join(model, "tokenizer.json")
