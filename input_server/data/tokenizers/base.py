"""The tokenizer interface (`Tokenizer`), what every kind reports (`IdsInfo`), and what the kinds
share (`ModelTokenizer`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from input_client import model_files
from input_client.spec import TokenizerSpec
from input_server.data.tokenizers.checks import bounded, model_faults
from input_server.data.tokenizers.groups import CUT_CHARS_PER_TOKEN, Cutter, TokenGroup
from input_server.data.tokenizers.route import AUDIT_EVERY, GATE_DOCS, Routed

__all__ = ["AUDIT_EVERY", "GATE_DOCS", "IdsInfo", "ModelTokenizer", "Tokenizer", "over_slices"]

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


class ModelTokenizer(Routed):
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
    cutter: Cutter | None = None

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
        self.settle()  # a worker process is handed the backend chosen behind the stream
        state = self.__dict__.copy()
        state["_model"] = None
        state.pop("_fast", None)  # each process loads its own
        state.pop("_behind", None)
        state.pop("audit_share", None)  # the stream's spare room is this process's to see
        return state

    def _encode_faulting(self, texts: list[str], **flags) -> list[np.ndarray]:
        self.model()  # its own faults say "loading"
        flags = {"add_bos": self.spec.add_bos, "add_eos": self.spec.add_eos, **flags}
        with model_faults(self.written, "tokenizing"):
            return self._encode(texts, **flags)

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
