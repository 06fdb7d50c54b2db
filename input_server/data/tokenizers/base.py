"""The tokenizer interface (`Tokenizer`), what every kind reports (`IdsInfo`, `Specials`), and
what the kinds share (`ModelTokenizer`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from input_client import model_files
from input_client.spec import TokenizerSpec
from input_server.data.tokenizers.backends import Backend, Choice
from input_server.data.tokenizers.checks import bounded, model_faults
from input_server.data.tokenizers.groups import CUT_CHARS_PER_TOKEN, Cutter, TokenGroup
from input_server.data.tokenizers.keep import ModelKeep
from input_server.data.tokenizers.memory import BYTES_PER_CHAR
from input_server.data.tokenizers.route import AUDIT_EVERY, GATE_DOCS, Router

__all__ = [
    "AUDIT_EVERY",
    "GATE_DOCS",
    "IdsInfo",
    "ModelTokenizer",
    "Specials",
    "Tokenizer",
    "over_slices",
]

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


@dataclasses.dataclass(frozen=True)
class Specials:
    """What surrounds every document, and the ids that are valid: what pre-tokenized ids are
    checked against and given (`data.ids`)."""

    vocab_size: int
    bos: int | None  # None: nothing prepended
    eos: int | None
    written: str  # the vocabulary's origin, for messages (the model as written, or the key)


@runtime_checkable
class Tokenizer(Protocol):
    """What the pipeline asks of its tokenizer, whether a model's (`ModelTokenizer`) or the
    ids-only one of a spec without a model (`data.ids.IdsOnly`). Picklable: a model is loaded
    lazily in each process that encodes.

    Attributes:
      spec: the tokenizer, its `model` the path opened (resolved inside the data roots).
      written: the model's path as the client wrote it (or the key that stands for it), which
        messages name.
      vocab_size: ids run from 0 to `vocab_size - 1`.
      choice: who tokenizes and why (`backends.Choice`); None: no model, nobody tokenizes.
      audit_share: while a fast backend serves, the share of the groups audited beyond one in
        `audit_every` (set when the tokenizer is made: `load_tokenizer`), 0 to 1 (the stream's
        spare room, which its producer writes each batch); this process's own, not handed to
        worker processes.
    """

    spec: TokenizerSpec
    written: str
    vocab_size: int
    choice: Choice | None
    audit_share: float

    def choose_backend(self, documents: list[str]) -> Choice | None:
        """Who tokenizes the stream, as `tokenizer.backend` asks, the gate run on `documents`
        (the stream's first); the choice, which `choice` holds from then on."""
        ...

    def fall_back(self, why: str) -> None:
        """The reference tokenizes from now on, in this process and later streams of the
        model, `why` said in the choice."""
        ...

    def trials(self) -> tuple[int, bool]:
        """The trials of a backend against the reference begun in this process so far, and
        whether one runs now (`speed.Trial`): a window of the stream measured across one
        times the trial, not the parallelism."""
        ...

    def specials(self) -> Specials:
        """What surrounds each document and the ids that are valid: what pre-tokenized ids
        are checked against and given (`data.ids`)."""
        ...

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

    def memory_bytes(self, text: str, trim_to: int | None) -> int:
        """About the most memory tokenizing `text` takes, when `trim_to` of its tokens are
        kept: the characters tokenized at once times the kind's bytes a character
        (`memory.BYTES_PER_CHAR`)."""
        ...

    def digest(self) -> str:
        """SHA-256 of the files its ids come from (the token cache's key; "" without a model)."""
        ...

    def library_version(self) -> str:
        """The version of the library that tokenizes ("none" without a model)."""
        ...


class ModelTokenizer:
    """What the kinds share: the model file resolved and bounded (`resolve`), loaded lazily
    (`model()`, from the kind's `_load`), its files and digest, and `encode` around the kind's
    batch call `_encode(texts, add_bos=, add_eos=)`, routed to a fast backend where one serves
    (its `router`, `route.Router`). A kind whose pieces never span a space sets `cutter`
    (`groups.Cutter`) to cut long documents before tokenizing; the others tokenize documents
    whole, then trim them. Beyond the pipeline's `Tokenizer`, DescribeTokenizer, the tune cache
    and `bench` read its `info`, `files`, `digest`, `library_version`, `limit_calls` and
    `maxtext_encoder`.

    Attributes:
      ADDED_IDS: ids the kind numbers after its model file's own (tiktoken's 256 specials),
        which a trainer's `vocab_size` does not count.
      REFERENCE: what `maxtext_encoder` runs, said in `bench`'s results.
      BACKENDS: the fast backends that may be exact for the kind, in the order "auto" tries
        them.
    """

    KIND: ClassVar[str]  # the `tokenizer.kind` it serves
    LIBRARY: ClassVar[str]  # the distribution that tokenizes
    REFERENCE: ClassVar[str]
    MAX_FILE_BYTES: ClassVar[int] = MAX_MODEL_BYTES
    ADDED_IDS: ClassVar[int] = 0
    BACKENDS: ClassVar[tuple[str, ...]] = ()
    cutter: Cutter | None = None

    def __init__(
        self,
        spec: TokenizerSpec,
        *,
        written: str | None = None,
        sidecars: dict | None = None,
        audit_every: int = AUDIT_EVERY,
        keep: ModelKeep | None = None,
        load_behind: bool = False,
    ):
        self.spec = spec
        self.written = spec.model if written is None else written
        # Files beside the model that name its tokens (Hugging Face's configs), resolved.
        self.sidecars = dict(sidecars or {})
        self._model = None
        self.router = Router(
            self, self.BACKENDS, audit_every=audit_every, keep=keep, load_behind=load_behind
        )
        self.vocab_size = self.info().vocab_size

    @classmethod
    def resolve(cls, access, spec: TokenizerSpec) -> tuple[str, dict[str, str]]:
        """The model file inside `access`'s data roots, bounded by MAX_FILE_BYTES, and the
        files beside it that the kind reads too (none)."""
        why = f" as a {cls.KIND} model" if cls.MAX_FILE_BYTES != MAX_MODEL_BYTES else ""
        path = access.file(spec.model, "tokenizer.model")
        return bounded(path, cls.MAX_FILE_BYTES, spec.model, why), {}

    @classmethod
    def process_bytes(cls, file_bytes: int) -> int:
        """What one process's loaded copy of a model file of `file_bytes` costs, as a stream's
        budget counts it in each of its worker processes (`batching.budget.StreamBudget`). 0:
        not counted, the kind's loaded models being small beside a stream's batches."""
        return 0

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
        """The vocabulary size and special ids (what DescribeTokenizer answers)."""
        raise NotImplementedError

    def files(self) -> dict[str, str]:
        """The files its tokens come from, as `input_client.model_files.digest` takes them."""
        return {"": self.spec.model}

    def digest(self) -> str:
        """SHA-256 of `files()` (`input_client.model_files.digest`)."""
        return model_files.digest(self.files())

    @classmethod
    def library_version(cls) -> str:
        """The version of the library that tokenizes (part of the tune cache's key)."""
        try:
            return metadata.version(cls.LIBRARY)
        except metadata.PackageNotFoundError:
            return "none"

    def limit_calls(self, threads: int) -> dict[str, LimitCall]:
        """The kind's own fastest batch calls on `threads` threads, by name (`bench`'s limit)."""
        raise NotImplementedError

    def maxtext_encoder(self) -> Callable[[str], list[int]]:
        """One document's ids as MaxText's tokenizer class of the kind gives them (`bench`'s
        reference; see REFERENCE)."""
        raise NotImplementedError

    def load_backend(self, name: str) -> Backend:
        """The kind's fast backend `name`, loaded (`fast.py`); the router keeps it loaded
        once a process for each model (`Router.loaded_backend`)."""
        raise NotImplementedError(f"{self.KIND} models have no fast backend {name!r}")

    def not_tried(self, name: str) -> str | None:
        """Why "auto" does not try backend `name` on this model (None: it does)."""
        return None

    def __getstate__(self):
        self.router.settle()  # a worker process is handed the backend chosen behind the stream
        state = self.__dict__.copy()
        state["_model"] = None
        return state

    # -- the pipeline's `Tokenizer`: who tokenizes is the router's ---------------------------

    @property
    def choice(self) -> Choice:
        return self.router.choice

    @property
    def audit_share(self) -> float:
        return self.router.audit_share

    @audit_share.setter
    def audit_share(self, share: float) -> None:
        self.router.audit_share = share

    def choose_backend(self, documents: list[str]) -> Choice:
        return self.router.choose_backend(documents)

    def fall_back(self, why: str) -> None:
        self.router.fall_back(why)

    def settle(self) -> Choice:
        """The choice, once a backend loading behind the stream is chosen or refused."""
        return self.router.settle()

    def trials(self) -> tuple[int, bool]:
        return self.router.trials()

    def encode(
        self, texts: list[str], first_doc: int = 0, trim_to: int | None = None
    ) -> TokenGroup:
        return self.router.encode(texts, first_doc, trim_to)

    def specials(self) -> Specials:
        """An id the model lacks (-1) adds nothing, as sentencepiece's own `add_bos` does and
        transformers' does for an unset `bos_token`."""
        info, t = self.info(), self.spec
        return Specials(
            vocab_size=info.vocab_size,
            bos=info.bos_id if t.add_bos and info.bos_id >= 0 else None,
            eos=info.eos_id if t.add_eos and info.eos_id >= 0 else None,
            written=f"`tokenizer.model` {self.written!r} ({info.vocab_size} ids)",
        )

    def ends(
        self, add_bos: bool | None = None, add_eos: bool | None = None
    ) -> tuple[list[int], list[int]]:
        """The ids put before and after each document's own: BOS and EOS as the flags say (the
        spec's by default) where the model has them."""
        info = self.info()
        add_bos = self.spec.add_bos if add_bos is None else add_bos
        add_eos = self.spec.add_eos if add_eos is None else add_eos
        head = [info.bos_id] if add_bos and info.bos_id >= 0 else []
        return head, [info.eos_id] if add_eos and info.eos_id >= 0 else []

    def reference_ids(self, texts: list[str], **flags: bool) -> list[np.ndarray]:
        """Each text's ids by the kind's library (the reference), BOS/EOS as the spec says
        unless `add_bos`/`add_eos` are given; a fault of the model's is named."""
        self.model()  # its own faults say "loading"
        flags = {"add_bos": self.spec.add_bos, "add_eos": self.spec.add_eos, **flags}
        with model_faults(self.written, "tokenizing"):
            return self._encode(texts, **flags)

    def learn_chars_per_token(self, texts: list[str]) -> float:
        """Tokenizes a sample of the data to learn its characters per token (pickled with the
        tokenizer, so worker processes start from it rather than CUT_CHARS_PER_TOKEN)."""
        if self.cutter is None or not self.cutter.learns:
            return CUT_CHARS_PER_TOKEN
        self.cutter.learn(texts, self.reference_ids(texts))
        return self.cutter.chars_per_token

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        if self.cutter is None:
            return text_chars
        return self.cutter.tokenized_chars(text_chars, trim_to)

    def memory_bytes(self, text: str, trim_to: int | None) -> int:
        chars = len(text)
        if trim_to is not None and self.cutter is not None:
            first = self.cutter.first_cut(text, trim_to)
            # A prefix that holds too few tokens grows to the next place to cut: the longest
            # stretch without one is what growing may tokenize at once.
            chars = (
                first if first == chars else max(first, self.cutter.longest_uncut(text, trim_to))
            )
        return chars * BYTES_PER_CHAR[self.KIND]


def over_slices(call: LimitCall, threads: int) -> LimitCall:
    """`call` on `threads` threads, one contiguous slice of the texts each: no future per
    document, no Python ints."""

    def run(texts: list[str]) -> list[int]:
        step = -(-len(texts) // threads) or 1
        with ThreadPoolExecutor(threads) as pool:
            done = pool.map(call, [texts[i : i + step] for i in range(0, len(texts), step)])
            return [n for lengths in done for n in lengths]

    return run
