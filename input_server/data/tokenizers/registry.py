"""The tokenizer kinds by `tokenizer.kind` name, and a spec's tokenizer opened through them.

Adding a kind: a module with a `ModelTokenizer` subclass (its reference library's `_load`,
`_encode` and `info`, its fast backends' `load_backend`), and its line below.
"""

from __future__ import annotations

import dataclasses
import os

from input_client.spec import TokenizerSpec
from input_server.data.roots import OPERATOR
from input_server.data.tokenizers.base import ModelTokenizer
from input_server.data.tokenizers.huggingface import HuggingFaceTokenizer
from input_server.data.tokenizers.keep import ModelKeep
from input_server.data.tokenizers.route import AUDIT_EVERY
from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer
from input_server.data.tokenizers.tekken import TekkenTokenizer
from input_server.data.tokenizers.tiktoken import TiktokenTokenizer

# In `input_client.spec.TOKENIZER_KINDS` order.
KINDS: dict[str, type[ModelTokenizer]] = {
    cls.KIND: cls
    for cls in (
        SentencepieceTokenizer,
        HuggingFaceTokenizer,
        TiktokenTokenizer,
        TekkenTokenizer,
    )
}


def resolve_model(access, spec: TokenizerSpec) -> tuple[str, dict[str, str]]:
    """The files a spec's model is read from, checked against `access`'s data roots and
    bounded in size: the model file, and the files beside it its kind reads too (Hugging
    Face's configs), those that exist."""
    return KINDS[spec.kind].resolve(access, spec)


@dataclasses.dataclass(frozen=True)
class FoundModel:
    """A spec's model found once (`find_model`): the files it is read from, and what it costs
    in memory as its kind reports (the stream's budget counts it before the model is read).

    Attributes:
      path: the model file, checked against the data roots and bounded in size.
      sidecars: the files beside it its kind reads too (Hugging Face's configs), those that
        exist.
      file_bytes: the model file's size (0: not there yet; opening it says why).
      process_bytes: one process's loaded copy (`ModelTokenizer.process_bytes`; 0: not
        counted).
    """

    path: str
    sidecars: dict[str, str]
    file_bytes: int
    process_bytes: int


def find_model(access, spec: TokenizerSpec) -> FoundModel:
    """A spec's model found inside `access`'s data roots (`resolve_model`), with its kind's
    report of what a process's copy costs."""
    kind = KINDS[spec.kind]
    path, sidecars = kind.resolve(access, spec)
    try:
        size = os.path.getsize(path)
    except OSError:  # a missing file is named when it is opened
        size = 0
    return FoundModel(path, sidecars, size, kind.process_bytes(size))


def open_tokenizer(
    spec: TokenizerSpec,
    *,
    written: str | None = None,
    sidecars: dict | None = None,
    audit_every: int = AUDIT_EVERY,
    keep: ModelKeep | None = None,
    load_behind: bool = False,
) -> ModelTokenizer:
    """The tokenizer for `spec`, its `model` already resolved (`resolve_model`); `written` is
    the model as the client wrote it, for messages. The rest is how its router routes
    (`route.Router`)."""
    return KINDS[spec.kind](
        spec,
        written=written,
        sidecars=sidecars,
        audit_every=audit_every,
        keep=keep,
        load_behind=load_behind,
    )


def load_tokenizer(
    spec: TokenizerSpec,
    access=None,
    *,
    found: FoundModel | None = None,
    keep: ModelKeep | None = None,
    audit_every: int = AUDIT_EVERY,
    load_behind: bool = False,
) -> ModelTokenizer:
    """The tokenizer for `spec`, its files found (`resolve_model`) inside `access`'s data roots
    (default: the operator's tools, which see every path); messages name the model as written.
    How it routes is set here, for good (`route.Router`): `keep` (a `keep.ModelKeep`, `serve
    --tokenizer-cache`) is where what is derived from the model is read and kept (None: this
    process's memory only); while a fast backend serves, one group in `audit_every` is
    encoded again by the reference (0: none); with `load_behind` (a server's request
    streams), a backend not loaded in this process yet loads behind the stream while the
    reference serves. `found`: the model already found (`find_model`), not looked up again.
    Every call makes a new tokenizer: no two pipelines share one."""
    if found is None:
        found = find_model(access or OPERATOR, spec)
    return open_tokenizer(
        dataclasses.replace(spec, model=found.path),
        written=spec.model,
        sidecars=found.sidecars,
        audit_every=audit_every,
        keep=keep,
        load_behind=load_behind,
    )
