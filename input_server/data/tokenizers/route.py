"""Who tokenizes a model's groups (`Routed`, which `base.ModelTokenizer` is): the kind's
reference library, or a fast backend (`backends.Backend`) that the gate let serve, one group in
`audit_every` encoded again by the reference while it does."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
from typing import ClassVar

import numpy as np

from input_server.data.tokenizers import backends
from input_server.data.tokenizers.backends import Backend, Choice
from input_server.data.tokenizers.checks import NOT_THE_MODEL
from input_server.data.tokenizers.groups import TokenGroup, flat_group, group_of
from input_server.data.tokenizers.keep import ModelKeep
from input_server.errors import InvalidSpecError

log = logging.getLogger(__name__)

# The stream's first documents the gate compares (beyond the probes), at most.
GATE_DOCS = 64
# One group in this many is encoded again by the reference while a backend serves
# (`serve --tokenizer-audit-every`).
AUDIT_EVERY = 64

# Backends loaded in this process, by (tokenizer class, model digest, backend): shared by its
# streams (a backend encodes from any thread). Few: each holds a model. One load of each key
# at a time (a fresh worker's threads would each load Llama 3's 1.7 s, twice the memory); a
# model already loaded, or another model's load, never waits behind it.
_BACKENDS: collections.OrderedDict[tuple, Backend] = collections.OrderedDict()
_BACKENDS_LOCK = threading.Lock()
_LOADING: dict[tuple, threading.Lock] = {}  # the keys being loaded now, each its own lock
MAX_BACKENDS = 4
# The backends that may load behind a stream (`Routed.load_behind`). Not kitoken: a server
# loading it behind a sentencepiece stream died in 3 of 7 tries on the 2-core host (no Python
# error; never without it), and it loads in tens of ms.
LOADS_BEHIND = ("fastokens",)


def _failure(e: BaseException) -> BaseException:
    """`e` if the interpreter must keep it (a stop asked for, memory); else a backend's fault,
    which the reference answers for: Rust panics (pyo3's PanicException) are BaseException."""
    if isinstance(e, NOT_THE_MODEL):
        raise e
    return e


class _Behind:
    """A backend being loaded and gated on a thread while the reference serves."""

    def __init__(self):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.groups = 0  # the groups the reference began meanwhile


class Routed:
    """Who tokenizes, for a `ModelTokenizer`: `choose_backend` runs the gate; `encode` routes
    each group and audits one in `audit_every`; `fall_back` moves this process's copy (and
    later streams of the model) to the reference."""

    # The fast backends that may be exact for the kind, in the order "auto" tries them.
    BACKENDS: ClassVar[tuple[str, ...]] = ()
    choice = Choice("reference", "no backend chosen (the pipeline chooses on its sample)")
    audit_every = AUDIT_EVERY
    # The share of the other groups audited too, 0 to 1: the room the stream has to spare
    # (its producer waits on the client), as the serving stream's `AuditPace` says. Set on this
    # process's copy; a worker process's copy audits one group in `audit_every`.
    audit_share = 0.0
    # Where what is derived from the model is kept across processes and restarts (`serve
    # --tokenizer-cache`); None: in this process's memory only.
    keep: ModelKeep | None = None
    # Whether a backend not yet loaded in this process loads behind the stream while the
    # reference serves (a server's request streams); else the choice waits for it.
    load_behind = False

    @classmethod
    def library_version(cls) -> str:
        raise NotImplementedError

    def _backend(self, name: str) -> Backend:
        """The kind's backend `name`, loaded (`fast.py`)."""
        raise NotImplementedError

    def _read_from_cache(self, what: str) -> None:
        """Notes that `what` (part of loading a backend) was read from `keep`: the choice's
        why says so."""
        self.__dict__.setdefault("_cache_reads", []).append(what)

    def _not_tried(self, name: str) -> str | None:
        """Why "auto" does not try backend `name` on this model (None: it does)."""
        return None

    def _loaded_backend(self, name: str) -> Backend:
        """`_backend(name)`, loaded once a process for each model (by its digest): a stream
        of a request's spec makes a new tokenizer, and loading Llama 3's derived
        tokenizer.json into fastokens takes 1.7 s."""
        key = (type(self), self.digest(), name)
        while True:
            with _BACKENDS_LOCK:
                fast = _BACKENDS.get(key)
                if fast is not None:
                    _BACKENDS.move_to_end(key)
                    return fast
                loading = _LOADING.get(key)
                if loading is None:  # this thread loads it
                    loading = _LOADING[key] = threading.Lock()
                    loading.acquire()
                    break
            with loading:  # another thread loads it: wait, then look again (it may have failed)
                pass
        try:
            fast = self._backend(name)
            with _BACKENDS_LOCK:
                _BACKENDS[key] = fast
                while len(_BACKENDS) > MAX_BACKENDS:
                    _BACKENDS.popitem(last=False)
        finally:
            with _BACKENDS_LOCK:
                del _LOADING[key]
            loading.release()
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

    def _fast_ids(
        self, fast: Backend, texts: list[str], *, add_bos: bool, add_eos: bool
    ) -> list[np.ndarray]:
        """`_encode`'s answer (each text's ids, BOS/EOS as the flags say) from `fast`."""
        group = self._framed_group(fast, texts, *self._ends(add_bos, add_eos), 0, None)
        stops = np.cumsum(group.lengths).tolist()
        return [group.tokens[e - n : e] for e, n in zip(stops, group.lengths.tolist(), strict=True)]

    def _served_ids(self, fast: Backend, texts: list[str]) -> list[np.ndarray]:
        """What serving gives `texts` through `fast`, with the spec's BOS/EOS: a group the
        library cannot take (lone surrogates) goes to the reference, as `encode` sends it."""
        flags = {"add_bos": self.spec.add_bos, "add_eos": self.spec.add_eos}
        try:
            return self._fast_ids(fast, texts, **flags)
        except UnicodeEncodeError:
            return self._encode_faulting(texts)

    def choose_backend(self, documents: list[str]) -> Choice:
        """Who tokenizes, as `tokenizer.backend` asks: for "auto" or a backend's name, the
        first backend that passes the gate (`backends.gate`) on the probes and `documents`,
        with the spec's BOS/EOS, else the reference, with why. A backend named for a kind it
        does not serve is refused. With `load_behind`, a backend not loaded in this process
        yet is loaded and gated on a thread while the reference serves (`_choose_behind`)."""
        want = self.spec.backend
        if want not in ("auto", "reference", *self.BACKENDS):
            served = ", ".join(self.BACKENDS) or "none"
            raise InvalidSpecError(
                f"`tokenizer.backend` {want!r} does not serve {self.KIND} models "
                f"(theirs: {served}; or auto, reference)."
            )
        if want == "reference":
            return self._serve(Choice("reference", 'asked for (`tokenizer.backend = "reference"`)'))
        names = self.BACKENDS if want == "auto" else (want,)
        behind = self.load_behind and all(name in LOADS_BEHIND for name in names)
        if behind and not self._any_loaded(names):
            return self._choose_behind(names, documents[:GATE_DOCS])
        choice, fast = self._gated(names, documents[:GATE_DOCS])
        self._fast = fast
        return self._serve(choice)

    def _any_loaded(self, names: tuple[str, ...]) -> bool:
        """Whether one of the backends `names` is loaded in this process for this model."""
        digest = self.digest()
        with _BACKENDS_LOCK:
            return any((type(self), digest, name) in _BACKENDS for name in names)

    def _gated(self, names: tuple[str, ...], documents: list[str]) -> tuple[Choice, Backend | None]:
        """The first of `names` that loads and passes the gate on `documents`, and it loaded;
        else the reference's choice, saying why each was not chosen, and None."""
        reasons = []
        for name in names:
            if self.spec.backend == "auto" and (skip := self._not_tried(name)):
                reasons.append(skip)  # named, it is tried: the gate decides
                continue
            try:
                fast = self._loaded_backend(name)
            except BaseException as e:  # a library missing or refusing the model: the reference
                e = _failure(e)
                reasons.append(f"{name} could not load the model ({type(e).__name__}: {e})")
                continue
            choice = backends.gate(
                self.digest(),
                self._encode_faulting,
                lambda texts, fast=fast: self._served_ids(fast, texts),
                fast,
                documents,
                keep=self.keep,
                reference_version=self.library_version(),
            )
            if choice.backend != "reference":
                reads = self.__dict__.pop("_cache_reads", [])
                if reads:
                    why = f"{choice.why}; read from the tokenizer cache: {', '.join(reads)}"
                    choice = Choice(choice.backend, why)
                return choice, fast
            reasons.append(choice.why)
        return Choice("reference", "; ".join(reasons) or f"no fast backend for {self.KIND}"), None

    def _choose_behind(self, names: tuple[str, ...], documents: list[str]) -> Choice:
        """The reference serves from the first group while a thread loads the backends and
        runs the gate (loading Llama 3's derived tokenizer.json took 1.1-1.7 s of a restarted
        server's first batch); one that passes serves from the next group on. Batches are the
        same bytes either way (the gate): only who makes them changes."""
        behind = self.__dict__["_behind"] = _Behind()
        choice = self._serve(
            Choice(
                "reference", f"while {' or '.join(names)} loads and meets the gate", pending=True
            )
        )
        threading.Thread(
            target=self._settle_behind,
            args=(behind, names, documents),
            name="backend-behind",
            daemon=True,
        ).start()
        return choice

    def _settle_behind(self, behind: _Behind, names: tuple[str, ...], documents: list[str]) -> None:
        try:
            choice, fast = self._gated(names, documents)
        except BaseException as e:  # noqa: BLE001 - stopping or out of memory: the reference stays
            choice = Choice("reference", f"choosing a backend failed ({type(e).__name__}: {e})")
            fast = None
        with behind.lock:  # between two groups: `_counted_serving` holds it to pick one
            if fast is not None:
                served = f"the reference served the first {behind.groups} groups while it loaded"
                choice = Choice(choice.backend, f"{choice.why}; {served}")
            self._fast = fast
            self._serve(choice)
            behind.done.set()
        log.info("`tokenizer.model` %r: %s", self.written, self.choice.why)

    def settle(self) -> Choice:
        """The choice, once a backend loading behind the stream (`_choose_behind`) is chosen
        or refused: what a worker process is handed."""
        behind = self.__dict__.get("_behind")
        if behind is not None:
            behind.done.wait()
        return self.choice

    def _serve(self, choice: Choice) -> Choice:
        self.choice = choice
        if choice.backend == "reference":
            self._fast = None
        return choice

    def fall_back(self, why: str) -> None:
        """The reference tokenizes from now on in this process, and later streams of the model
        skip the backend (`backends.forget`)."""
        fast = self.__dict__.get("_fast")
        if fast is not None:
            backends.forget(
                self.digest(),
                fast,
                why,
                keep=self.keep,
                reference_version=self.library_version(),
            )
        self._serve(Choice("reference", why))

    def _serving(self) -> Backend | None:
        """The backend that encodes in this process, loaded on first use; None: the reference
        (also when the backend the gate chose will not load here: it falls back, saying why)."""
        choice = self.choice
        if choice.backend == "reference":
            return None
        fast = self.__dict__.get("_fast")
        if fast is None or fast.name != choice.backend:
            try:
                fast = self._loaded_backend(choice.backend)
            except BaseException as e:
                e = _failure(e)
                self.fall_back(f"{choice.backend} would not load ({type(e).__name__}: {e})")
                return None
            self._fast = fast
        return fast

    def _counted_serving(self) -> Backend | None:
        """`_serving()`; while a backend loads behind the stream, the groups the reference
        begins are counted (the choice's why says how many it served)."""
        behind = self.__dict__.get("_behind")
        if behind is None or behind.done.is_set():
            return self._serving()
        with behind.lock:
            fast = self._serving()
            if fast is None and not behind.done.is_set():
                behind.groups += 1
            return fast

    def encode(
        self, texts: list[str], first_doc: int = 0, trim_to: int | None = None
    ) -> TokenGroup:
        """The group, by the serving backend if any (one group in `audit_every`, and
        `audit_share` of the others, compared with the reference's: a difference serves the
        reference's and falls back for good), else by the reference. A backend's failure (a
        panic too) sends its group to the reference, marked `fell_back` (the stream counts it;
        the first is logged)."""
        fast = self._counted_serving()
        if fast is None:
            return self._reference_group(texts, first_doc, trim_to)
        try:
            group = self._fast_group(fast, texts, first_doc, trim_to)
        except BaseException as e:
            _failure(e)
            if next(self.__dict__.setdefault("fell_back_groups", itertools.count(1))) == 1:
                log.warning(
                    "`tokenizer.model` %r: %s %s failed on the group of documents %d+ (%s: "
                    "%s); the reference encodes each group it fails on",
                    *(self.written, fast.name, fast.version, first_doc, type(e).__name__, e),
                )
            group = self._reference_group(texts, first_doc, trim_to)
            return dataclasses.replace(group, fell_back=True)
        group = dataclasses.replace(group, by_backend=True)
        counter = self.__dict__.setdefault("_groups", itertools.count())  # atomic under the GIL
        if not self.audit_every or (next(counter) % self.audit_every and not self._spare()):
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
        return dataclasses.replace(want, audited=True, mismatched=True, by_backend=True)

    def _spare(self) -> bool:
        """Whether this group is one of the `audit_share` audited on the stream's spare room:
        the share accrues a group at a time (threads may race on it: a group more or less)."""
        credit = self.__dict__.get("_audit_credit", 0.0) + self.audit_share
        self._audit_credit = credit - (credit >= 1.0)
        return credit >= 1.0

    def _reference_group(self, texts: list[str], first_doc: int, trim_to: int | None) -> TokenGroup:
        if trim_to is None or self.cutter is None or not self.cutter.cuts(texts, trim_to):
            ids = self._encode_faulting(texts)
        else:
            ids = self.cutter.encode(self._encode_faulting, texts, trim_to)
        return group_of(ids, first_doc, trim_to)

    def _fast_group(
        self, fast: Backend, texts: list[str], first_doc: int, trim_to: int | None
    ) -> TokenGroup:
        if trim_to is not None and self.cutter is not None and self.cutter.cuts(texts, trim_to):
            encode = lambda t, **flags: self._fast_ids(fast, t, **flags)  # noqa: E731
            return group_of(self.cutter.encode(encode, texts, trim_to), first_doc, trim_to)
        head, tail = self._ends(self.spec.add_bos, self.spec.add_eos)
        return self._framed_group(fast, texts, head, tail, first_doc, trim_to)

    def _framed_group(
        self,
        fast: Backend,
        texts: list[str],
        head: list[int],
        tail: list[int],
        first_doc: int,
        trim_to: int | None,
    ) -> TokenGroup:
        """The group of `texts` by `fast`, `head` and `tail` around each text's ids: put in
        place as the backend reads its answer when it can (`encode_framed`), else after."""
        encode_framed = getattr(fast, "encode_framed", None)
        if encode_framed is None:
            flat, offsets = self._fast_flat(fast, texts)
            return flat_group(flat, offsets, head, tail, first_doc, trim_to)
        flat, offsets = encode_framed(texts, head, tail)
        return flat_group(flat, offsets, [], [], first_doc, trim_to)
