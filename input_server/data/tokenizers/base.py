"""The tokenizer interface (`Tokenizer`), what every kind reports (`IdsInfo`), and what the kinds
share (`ModelTokenizer`)."""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from input_client import model_files
from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import backends
from input_server.data.tokenizers.backends import Backend, Choice
from input_server.data.tokenizers.checks import bounded, model_faults
from input_server.data.tokenizers.groups import (
    CUT_CHARS_PER_TOKEN,
    Cutter,
    TokenGroup,
    flat_group,
    group_of,
)
from input_server.errors import InvalidSpecError

log = logging.getLogger(__name__)

# Backends loaded in this process, by (tokenizer class, model digest, backend): shared by its
# streams (a backend encodes from any thread). Few: each holds a model.
_BACKENDS: collections.OrderedDict[tuple, Backend] = collections.OrderedDict()
_BACKENDS_LOCK = threading.Lock()
MAX_BACKENDS = 4

# The stream's first documents the gate compares (beyond the probes), at most.
GATE_DOCS = 64
# One group in this many is encoded again by the reference while a backend serves
# (`serve --tokenizer-audit-every`).
AUDIT_EVERY = 64

# The most a model file may hold, unless its kind says less (`ModelTokenizer.MAX_FILE_BYTES`):
# each kind reads it whole into memory (a named 5 GB jsonl would otherwise be read as a model).
MAX_MODEL_BYTES = 1 << 30

# A kind's batch call for `bench`'s limit: texts in, each text's token count out.
LimitCall = Callable[[list[str]], list[int]]


@dataclasses.dataclass(frozen=True)
class IdsInfo:
    """A model's vocabulary and special ids; -1 where the model has no such token."""

    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int


@runtime_checkable
class Tokenizer(Protocol):
    """What a tokenizer of any kind gives the pipeline, DescribeTokenizer, the tune cache and
    `bench`. Picklable: the model is loaded lazily in each process that encodes.

    Attributes:
      spec: the tokenizer, its `model` the path opened (resolved inside the data roots).
      written: the model's path as the client wrote it, which messages name.
      vocab_size: ids run from 0 to `vocab_size - 1` (`info().vocab_size`).
      ADDED_IDS: ids the kind numbers after its model file's own (tiktoken's 256 specials),
        which a trainer's `vocab_size` does not count.
      REFERENCE: what `maxtext_encoder` runs, said in `bench`'s results.
    """

    spec: TokenizerSpec
    written: str
    vocab_size: int
    ADDED_IDS: int
    REFERENCE: str

    def encode(
        self, texts: list[str], first_doc: int = 0, trim_to: int | None = None
    ) -> TokenGroup:
        """The group of `texts`, BOS/EOS added as MaxText's tokenizer class of the kind adds
        them, documents longer than `trim_to` trimmed to their first tokens. Runs on the
        calling thread and releases the GIL while the library works: the parallelism is
        Grain's threads and processes, which the tuner sizes."""
        ...

    def learn_chars_per_token(self, texts: list[str]) -> float:
        """Learns the data's characters per token from a sample (kinds that cut long documents
        before tokenizing size their cuts by it)."""
        ...

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        """About how many of a document's characters get tokenized when `trim_to` are kept."""
        ...

    def info(self) -> IdsInfo:
        """The vocabulary size and special ids (what DescribeTokenizer answers)."""
        ...

    def files(self) -> dict[str, str]:
        """The files its tokens come from, as `input_client.model_files.digest` takes them."""
        ...

    def digest(self) -> str:
        """SHA-256 of `files()` (`input_client.model_files.digest`)."""
        ...

    @classmethod
    def library_version(cls) -> str:
        """The version of the library that tokenizes (part of the tune cache's key)."""
        ...

    def limit_calls(self, threads: int) -> dict[str, LimitCall]:
        """The kind's own fastest batch calls on `threads` threads, by name (`bench`'s limit)."""
        ...

    def maxtext_encoder(self) -> Callable[[str], list[int]]:
        """One document's ids as MaxText's tokenizer class of the kind gives them (`bench`'s
        reference; see REFERENCE)."""
        ...


class ModelTokenizer:
    """What the kinds share: the model file resolved and bounded (`resolve`), loaded lazily
    (`model()`, from the kind's `_load`), its files and digest, and `encode` around the kind's
    batch call `_encode(texts, add_bos=, add_eos=)`. A kind whose pieces never span a space
    sets `cutter` (`groups.Cutter`) to cut long documents before tokenizing; the others
    tokenize documents whole, then trim them."""

    KIND: ClassVar[str]  # the `tokenizer.kind` it serves
    LIBRARY: ClassVar[str]  # the distribution that tokenizes
    REFERENCE: ClassVar[str]
    MAX_FILE_BYTES: ClassVar[int] = MAX_MODEL_BYTES
    ADDED_IDS: ClassVar[int] = 0
    # The fast backends that may be exact for the kind, in the order "auto" tries them.
    BACKENDS: ClassVar[tuple[str, ...]] = ()
    cutter: Cutter | None = None
    # Who tokenizes (`choose_backend`); one group in `audit_every` is checked (0: none).
    choice = Choice("reference", "no backend chosen (the pipeline chooses on its sample)")
    audit_every = AUDIT_EVERY

    def __init__(
        self, spec: TokenizerSpec, *, written: str | None = None, sidecars: dict | None = None
    ):
        self.spec = spec
        self.written = spec.model if written is None else written
        # Files beside the model that name its tokens (Hugging Face's configs), resolved.
        self.sidecars = dict(sidecars or {})
        self._model = None
        self.vocab_size = self.info().vocab_size

    @classmethod
    def resolve(cls, access, spec: TokenizerSpec) -> tuple[str, dict[str, str]]:
        """The model file inside `access`'s data roots, bounded by MAX_FILE_BYTES, and the
        files beside it that the kind reads too (none)."""
        why = f" as a {cls.KIND} model" if cls.MAX_FILE_BYTES != MAX_MODEL_BYTES else ""
        path = access.file(spec.model, "tokenizer.model")
        return bounded(path, cls.MAX_FILE_BYTES, spec.model, why), {}

    def model(self):
        """The kind's loaded model; any fault of its own code says "loading" and names it."""
        if self._model is None:
            with model_faults(self.written, "loading"):
                self._model = self._load()
        return self._model

    def _load(self):
        raise NotImplementedError

    def _encode(self, texts: list[str], *, add_bos: bool, add_eos: bool) -> list[np.ndarray]:
        raise NotImplementedError

    def info(self) -> IdsInfo:
        raise NotImplementedError

    def files(self) -> dict[str, str]:
        return {"": self.spec.model}

    def digest(self) -> str:
        return model_files.digest(self.files())

    @classmethod
    def library_version(cls) -> str:
        try:
            return metadata.version(cls.LIBRARY)
        except metadata.PackageNotFoundError:
            return "none"

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_model"] = None
        state.pop("_fast", None)  # each process loads its own
        return state

    # -- who tokenizes: the reference, or a fast backend the gate let serve ------------------

    def _backend(self, name: str) -> Backend:
        """The kind's backend `name`, loaded (`fast.py`)."""
        raise NotImplementedError

    def _loaded_backend(self, name: str) -> Backend:
        """`_backend(name)`, loaded once a process for each model (by its digest): a stream
        of a request's spec makes a new tokenizer, and loading Llama 3's derived
        tokenizer.json into fastokens takes 1.7 s."""
        key = (type(self), self.digest(), name)
        with _BACKENDS_LOCK:
            fast = _BACKENDS.get(key)
            if fast is not None:
                _BACKENDS.move_to_end(key)
                return fast
        fast = self._backend(name)
        with _BACKENDS_LOCK:
            _BACKENDS[key] = fast
            while len(_BACKENDS) > MAX_BACKENDS:
                _BACKENDS.popitem(last=False)
        return fast

    def _ends(self, add_bos: bool, add_eos: bool) -> tuple[list[int], list[int]]:
        """The ids put before and after each document's own, as the flags say."""
        info = self.info()
        head = [info.bos_id] if add_bos and info.bos_id >= 0 else []
        return head, [info.eos_id] if add_eos and info.eos_id >= 0 else []

    def _fast_flat(self, fast: Backend, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each text's bare ids from `fast`: one flat array and len(texts) + 1 offsets."""
        encode_flat = getattr(fast, "encode_flat", None)
        if encode_flat is not None:
            return encode_flat(texts)
        ids = fast.encode(texts)
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum([len(x) for x in ids], out=offsets[1:])
        flat = np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, np.int32)
        return flat, offsets

    def _fast_ids(self, texts: list[str], *, add_bos: bool, add_eos: bool) -> list[np.ndarray]:
        """`_encode`'s answer from the serving backend."""
        group = flat_group(
            *self._fast_flat(self._fast, texts), *self._ends(add_bos, add_eos), 0, None
        )
        ends = np.cumsum(group.lengths)
        return [
            group.tokens[e - n : e]
            for e, n in zip(ends.tolist(), group.lengths.tolist(), strict=True)
        ]

    def _bare_reference(self, texts: list[str]) -> list[np.ndarray]:
        return self._encode_faulting(texts, add_bos=False, add_eos=False)

    def choose_backend(self, documents: list[str]) -> Choice:
        """Who tokenizes, as `tokenizer.backend` asks: for "auto" or a backend's name, the
        first backend that passes the gate (`backends.gate`) on the probes and `documents`,
        else the reference, with why. A backend named for a kind it does not serve is refused."""
        want = self.spec.backend
        if want != "auto" and want != "reference" and want not in self.BACKENDS:
            served = ", ".join(self.BACKENDS) or "none"
            raise InvalidSpecError(
                f"`tokenizer.backend` {want!r} does not serve {self.KIND} models "
                f"(theirs: {served}; or auto, reference)."
            )
        if want == "reference":
            return self._serve(Choice("reference", 'asked for (`tokenizer.backend = "reference"`)'))
        reasons = []
        for name in self.BACKENDS if want == "auto" else (want,):
            try:
                self._fast = self._loaded_backend(name)
            except Exception as e:  # a library missing or refusing the model: the reference
                reasons.append(f"{name} could not load the model ({type(e).__name__}: {e})")
                continue
            fast = self._fast
            choice = backends.gate(
                self.digest(),
                self._bare_reference,
                lambda texts, fast=fast: self._fast_bare(fast, texts),
                fast,
                documents[:GATE_DOCS],
            )
            if choice.backend != "reference":
                return self._serve(choice)
            reasons.append(choice.why)
        return self._serve(
            Choice("reference", "; ".join(reasons) or f"no fast backend for {self.KIND}")
        )

    def _fast_bare(self, fast: Backend, texts: list[str]) -> list[np.ndarray]:
        """What serving gives `texts` through `fast`, bare: a group with text the library
        cannot take (lone surrogates) goes to the reference, as `encode` sends it."""
        try:
            flat, offsets = self._fast_flat(fast, texts)
        except UnicodeEncodeError:
            return self._bare_reference(texts)
        flat = flat.view(np.int32) if flat.dtype == np.uint32 else flat
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(texts))]

    def _serve(self, choice: Choice) -> Choice:
        self.choice = choice
        if choice.backend == "reference":
            self._fast = None
        return choice

    def fall_back(self, why: str) -> None:
        """The reference tokenizes from now on in this process, and later streams of the model
        skip the backend (`backends.forget`)."""
        fast = getattr(self, "_fast", None)
        if fast is not None:
            backends.forget(self.digest(), fast.name, fast.version, why)
        self._serve(Choice("reference", why))

    def _serving(self) -> Backend | None:
        """The backend that encodes in this process, loaded on first use; None: the reference."""
        if self.choice.backend == "reference":
            return None
        fast = getattr(self, "_fast", None)
        if fast is None or fast.name != self.choice.backend:
            with model_faults(self.written, f"loading {self.choice.backend}"):
                self._fast = fast = self._loaded_backend(self.choice.backend)
        return fast

    def _encode_faulting(self, texts: list[str], **flags) -> list[np.ndarray]:
        self.model()  # its own faults say "loading"
        flags = {"add_bos": self.spec.add_bos, "add_eos": self.spec.add_eos, **flags}
        with model_faults(self.written, "tokenizing"):
            return self._encode(texts, **flags)

    def encode(
        self, texts: list[str], first_doc: int = 0, trim_to: int | None = None
    ) -> TokenGroup:
        """The group, by the serving backend if any (one group in `audit_every` compared
        with the reference's: a difference serves the reference's and falls back for good),
        else by the reference."""
        fast = self._serving()
        if fast is None:
            return self._reference_group(texts, first_doc, trim_to)
        try:
            group = self._fast_group(texts, first_doc, trim_to)
        except Exception:  # what the backend cannot encode (e.g. lone surrogates): the reference's
            return self._reference_group(texts, first_doc, trim_to)
        self._groups = getattr(self, "_groups", 0) + 1
        if not self.audit_every or (self._groups - 1) % self.audit_every:
            return group
        want = self._reference_group(texts, first_doc, trim_to)
        if group.same_ids(want):
            return dataclasses.replace(group, audited=True)
        why = (
            f"an audit found {fast.name} {fast.version}'s ids differ from the reference's in "
            f"the group of documents {first_doc} to {first_doc + len(texts) - 1}"
        )
        log.warning(
            "`tokenizer.model` %r: %s; the reference tokenizes from now on", self.written, why
        )
        self.fall_back(why)
        return dataclasses.replace(want, audited=True, mismatched=True)

    def _reference_group(self, texts: list[str], first_doc: int, trim_to: int | None) -> TokenGroup:
        if trim_to is None or self.cutter is None or not self.cutter.cuts(texts, trim_to):
            ids = self._encode_faulting(texts)
        else:
            ids = self.cutter.encode(self._encode_faulting, texts, trim_to)
        return group_of(ids, first_doc, trim_to)

    def _fast_group(self, texts: list[str], first_doc: int, trim_to: int | None) -> TokenGroup:
        if trim_to is not None and self.cutter is not None and self.cutter.cuts(texts, trim_to):
            return group_of(self.cutter.encode(self._fast_ids, texts, trim_to), first_doc, trim_to)
        flat, offsets = self._fast_flat(self._fast, texts)
        head, tail = self._ends(self.spec.add_bos, self.spec.add_eos)
        return flat_group(flat, offsets, head, tail, first_doc, trim_to)

    def learn_chars_per_token(self, texts: list[str]) -> float:
        """Tokenizes a sample of the data to learn its characters per token (pickled with the
        tokenizer, so worker processes start from it rather than CUT_CHARS_PER_TOKEN)."""
        if self.cutter is None or not self.cutter.learns:
            return CUT_CHARS_PER_TOKEN
        self.cutter.learn(texts, self._encode_faulting(texts))
        return self.cutter.chars_per_token

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        if self.cutter is None:
            return text_chars
        return self.cutter.tokenized_chars(text_chars, trim_to)


def over_slices(call: LimitCall, threads: int) -> LimitCall:
    """`call` on `threads` threads, one contiguous slice of the texts each: no future per
    document, no Python ints."""

    def run(texts: list[str]) -> list[int]:
        step = -(-len(texts) // threads) or 1
        with ThreadPoolExecutor(threads) as pool:
            done = pool.map(call, [texts[i : i + step] for i in range(0, len(texts), step)])
            return [n for lengths in done for n in lengths]

    return run
