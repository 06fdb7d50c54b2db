"""Who tokenizes a model's groups (`Router`, which every `base.ModelTokenizer` holds): the
kind's reference library, or a fast backend (`backends.Backend`) that the gate let serve, one
group in `audit_every` encoded again by the reference while it does."""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Protocol, runtime_checkable

import numpy as np

from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import backends, speed
from input_server.data.tokenizers.backends import Backend, Choice
from input_server.data.tokenizers.behind import LOADS_BEHIND, Behind
from input_server.data.tokenizers.checks import NOT_THE_MODEL
from input_server.data.tokenizers.groups import Cutter, TokenGroup, flat_group, group_of
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


def _failure(e: BaseException) -> BaseException:
    """`e` if the interpreter must keep it (a stop asked for, memory); else a backend's fault,
    which the reference answers for: Rust panics (pyo3's PanicException) are BaseException."""
    if isinstance(e, NOT_THE_MODEL):
        raise e
    return e


@runtime_checkable
class Routed(Protocol):
    """A model's tokenizer as its `Router` sees it (`base.ModelTokenizer`): the kind's
    reference library, the ids around each document, and the kind's fast backends.

    Attributes:
      spec: its `backend` says who may tokenize, its `add_bos`/`add_eos` what surrounds a text.
      written: the model's path as the client wrote it, which messages name.
      cutter: cuts long documents before tokenizing (`groups.Cutter`, or an object with its
        interface); None: documents are tokenized whole, then trimmed.
    """

    spec: TokenizerSpec
    written: str
    cutter: Cutter | None

    def digest(self) -> str:
        """The model's files' digest: backends and the gate's verdicts are kept by it."""
        ...

    def library_version(self) -> str:
        """The reference library's version (part of what a verdict is kept by)."""
        ...

    def reference_ids(self, texts: list[str], **flags: bool) -> list[np.ndarray]:
        """Each text's ids by the reference library, BOS/EOS as the spec says unless
        `add_bos`/`add_eos` are given."""
        ...

    def ends(
        self, add_bos: bool | None = None, add_eos: bool | None = None
    ) -> tuple[list[int], list[int]]:
        """The ids put before and after each document's own, as the flags say (the spec's by
        default)."""
        ...

    def load_backend(self, name: str) -> Backend:
        """The kind's backend `name`, loaded (`fast.py`); raises if it cannot be."""
        ...

    def not_tried(self, name: str) -> str | None:
        """Why "auto" does not try backend `name` on this model (None: it does)."""
        ...


class Router:
    """Who tokenizes a model's groups: `choose_backend` runs the gate; `encode` routes each
    group and audits one in `audit_every`; `fall_back` moves this process's copy (and later
    streams of the model) to the reference.

    Args:
      reference: the model's tokenizer, which it routes for (`Routed`).
      backends: the fast backends that may be exact for the kind, in the order "auto" tries
        them.
      audit_every: one group in this many is encoded again by the reference while a backend
        serves; 0: none (`serve --tokenizer-audit-every`).
      keep: where what is derived from the model is kept across processes and restarts
        (`serve --tokenizer-cache`); None: in this process's memory only.
      load_behind: whether a backend not yet loaded in this process loads behind the stream
        while the reference serves (a server's request streams); else the choice waits for it.
    """

    def __init__(
        self,
        reference: Routed,
        backends: tuple[str, ...],
        *,
        audit_every: int = AUDIT_EVERY,
        keep: ModelKeep | None = None,
        load_behind: bool = False,
    ):
        self.reference = reference
        self.backends = backends
        self.audit_every = audit_every
        self.keep = keep
        self.load_behind = load_behind
        # The share of the other groups audited too, 0 to 1: the room the stream has to spare
        # (its producer waits on the client), as the serving stream's `AuditPace` says. Set on
        # this process's copy; a worker process's copy audits one group in `audit_every`.
        self.audit_share = 0.0
        self.choice = Choice("reference", "no backend chosen (the pipeline chooses on its sample)")
        self._fast: Backend | None = None  # the backend serving in this process, once loaded
        self._behind: Behind | None = None  # a backend loading behind the stream
        # What loading the chosen backend read from `keep`: the choice's why says so.
        self._cache_reads: list[str] = []
        self._lock = threading.Lock()  # the counts below, which every encoding thread moves
        self._groups = 0  # the groups a backend encoded: one in `audit_every` is audited
        self._audit_credit = 0.0  # `audit_share` accrued, a group at a time
        self._failed_groups = 0
        # "auto": the chosen backend on trial against the reference on the stream's groups
        # (`speed.Trial`); after a verdict for the reference, the backend it held (`_loser`),
        # tried again later (`speed.retrial_after`); the gate's words, which the verdict follows.
        self._trial: speed.Trial | None = None
        self._loser: Backend | None = None
        self._since_verdict = 0
        self._retrial_after = speed.RETRIAL_GROUPS
        self._lost = 0  # trials the backend lost in a row
        self._gate_why = ""
        self._regime = speed.Regime()  # the groups encoded at once, against the verdict's
        self._trials = 0  # trials begun in this process

    def __getstate__(self):
        self.settle()  # a worker process is handed the backend chosen behind the stream
        state = self.__dict__.copy()
        del state["_lock"]
        state["_fast"] = None  # each process loads its own
        state["_behind"] = None
        state["audit_share"] = 0.0  # the stream's spare room is this process's to see
        # A worker process tries the backend on its own groups (its own threads, its share
        # of the host), unless this process's trial has judged.
        state["_loser"] = None
        if self.choice.backend == "reference":  # a re-trial of a set-aside backend: this
            state["_trial"] = None  # process's (the worker has no backend to try)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def backend(self) -> Backend | None:
        """The fast backend loaded to serve in this process (None: none yet, or the
        reference serves)."""
        return self._fast

    @property
    def failed_groups(self) -> int:
        """The groups the serving backend failed on (an error, a panic) in this process's
        copy, which the reference encoded: the first is logged, the stream counts them all."""
        return self._failed_groups

    def note_cache_read(self, what: str) -> None:
        """Notes that `what` (part of loading a backend) was read from `keep`: the choice's
        why says so."""
        self._cache_reads.append(what)

    def loaded_backend(self, name: str) -> Backend:
        """The model's backend `name` (`Routed.load_backend`), loaded once a process for each
        model (by its digest): a stream of a request's spec makes a new tokenizer, and loading
        Llama 3's derived tokenizer.json into fastokens takes 1.7 s."""
        key = (type(self.reference), self.reference.digest(), name)
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
            fast = self.reference.load_backend(name)
            with _BACKENDS_LOCK:
                _BACKENDS[key] = fast
                while len(_BACKENDS) > MAX_BACKENDS:
                    _BACKENDS.popitem(last=False)
        finally:
            with _BACKENDS_LOCK:
                del _LOADING[key]
            loading.release()
        return fast

    def _fast_ids(
        self, fast: Backend, texts: list[str], *, add_bos: bool, add_eos: bool
    ) -> list[np.ndarray]:
        """The reference's answer (each text's ids, BOS/EOS as the flags say) from `fast`."""
        group = self._framed_group(fast, texts, *self.reference.ends(add_bos, add_eos), 0, None)
        stops = np.cumsum(group.lengths).tolist()
        return [group.tokens[e - n : e] for e, n in zip(stops, group.lengths.tolist(), strict=True)]

    def _served_ids(self, fast: Backend, texts: list[str]) -> list[np.ndarray]:
        """What serving gives `texts` through `fast`, with the spec's BOS/EOS: a group the
        library cannot take (lone surrogates) goes to the reference, as `encode` sends it."""
        spec = self.reference.spec
        try:
            return self._fast_ids(fast, texts, add_bos=spec.add_bos, add_eos=spec.add_eos)
        except UnicodeEncodeError:
            return self.reference.reference_ids(texts)

    def choose_backend(self, documents: list[str]) -> Choice:
        """Who tokenizes, as `tokenizer.backend` asks: for "auto" or a backend's name, the
        first backend that passes the gate (`backends.gate`) on the probes and `documents`,
        with the spec's BOS/EOS, else the reference, with why. A backend named for a kind it
        does not serve is refused. With `load_behind`, a backend not loaded in this process
        yet is loaded and gated on a thread while the reference serves (`_choose_behind`)."""
        spec = self.reference.spec
        want = spec.backend
        if want not in ("auto", "reference", *self.backends):
            served = ", ".join(self.backends) or "none"
            raise InvalidSpecError(
                f"`tokenizer.backend` {want!r} does not serve {spec.kind} models "
                f"(theirs: {served}; or auto, reference)."
            )
        if want == "reference":
            return self._serve(Choice("reference", 'asked for (`tokenizer.backend = "reference"`)'))
        names = self.backends if want == "auto" else (want,)
        behind = self.load_behind and all(name in LOADS_BEHIND for name in names)
        if behind and not self._any_loaded(names):
            return self._choose_behind(names, documents[:GATE_DOCS])
        choice, fast = self._gated(names, documents[:GATE_DOCS])
        self._fast = fast
        return self._serve(choice)

    def _any_loaded(self, names: tuple[str, ...]) -> bool:
        """Whether one of the backends `names` is loaded in this process for this model."""
        kind, digest = type(self.reference), self.reference.digest()
        with _BACKENDS_LOCK:
            return any((kind, digest, name) in _BACKENDS for name in names)

    def _gated(self, names: tuple[str, ...], documents: list[str]) -> tuple[Choice, Backend | None]:
        """The first of `names` that loads and passes the gate on `documents`, and it loaded;
        else the reference's choice, saying why each was not chosen, and None."""
        reasons, model = [], self.reference
        for name in names:
            if model.spec.backend == "auto" and (skip := model.not_tried(name)):
                reasons.append(skip)  # named, it is tried: the gate decides
                continue
            try:
                fast = self.loaded_backend(name)
            except BaseException as e:  # a library missing or refusing the model: the reference
                e = _failure(e)
                reasons.append(f"{name} could not load the model ({type(e).__name__}: {e})")
                continue
            choice = backends.gate(
                model.digest(),
                model.reference_ids,
                lambda texts, fast=fast: self._served_ids(fast, texts),
                fast,
                documents,
                keep=self.keep,
                reference_version=model.library_version(),
            )
            if choice.backend != "reference":
                reads, self._cache_reads = self._cache_reads, []
                if reads:
                    why = f"{choice.why}; read from the tokenizer cache: {', '.join(reads)}"
                    choice = Choice(choice.backend, why)
                return choice, fast
            reasons.append(choice.why)
        why = "; ".join(reasons) or f"no fast backend for {model.spec.kind}"
        return Choice("reference", why), None

    def _choose_behind(self, names: tuple[str, ...], documents: list[str]) -> Choice:
        """The reference serves from the first group while a thread loads the backends and
        runs the gate, once the reference has finished its first group (`behind`: loading
        Llama 3's derived tokenizer.json beside it held a restarted server's first batch up);
        one that passes serves from the next group on. Batches are the
        same bytes either way (the gate): only who makes them changes."""
        behind = self._behind = Behind()
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

    def _settle_behind(self, behind: Behind, names: tuple[str, ...], documents: list[str]) -> None:
        behind.wait_to_start()
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
        log.info("`tokenizer.model` %r: %s", self.reference.written, self.choice.why)

    def settle(self) -> Choice:
        """The choice, once a backend loading behind the stream (`_choose_behind`) is chosen
        or refused: what a worker process is handed."""
        if self._behind is not None:
            self._behind.go.set()  # needed now: no waiting for the reference's first groups
            self._behind.done.wait()
        return self.choice

    def _serve(self, choice: Choice) -> Choice:
        """`choice` serves from the next group; a backend "auto" chose goes on trial first.
        Under the lock a trial's verdict takes (`_judge`): a verdict never undoes a fall-back."""
        trial = None
        if choice.backend != "reference" and self.reference.spec.backend == "auto":
            trial = speed.Trial(choice.backend)
            tried = Choice(
                choice.backend,
                f"{choice.why}; on trial against the reference on the stream's first groups",
                pending=choice.pending,
            )
        with self._lock:
            self._loser, self._trial = None, trial
            if trial is not None:
                self._gate_why, choice = choice.why, tried
                self._trials += 1
            self.choice = choice
            if choice.backend == "reference":
                self._fast = None
        return choice

    def _trial_side(self) -> tuple[speed.Trial | None, str | None, bool]:
        """The trial running (None: none), who encodes the next group in it (None: as the
        choice says) and whether that group is timed; a new trial when one is due
        (`_next_trial`)."""
        trial = self._trial
        if trial is None:
            with self._lock:
                trial = self._next_trial()
            if trial is None:
                return None, None, False
        turn = trial.side()
        return (None, None, False) if turn is None else (trial, *turn)

    def _next_trial(self) -> speed.Trial | None:
        """Under the lock, a group's turn without a trial: a new one when it is due (None:
        not). The backend set aside, after `speed.retrial_after` groups; whichever side the
        verdict chose, when the groups encoded at once moved away from its regime
        (`speed.Regime`)."""
        if self._trial is not None:  # another thread's turn began one meanwhile
            return self._trial
        self._since_verdict += 1
        side = self._fast if self._fast is not None else self._loser
        moved = self._regime.counted() and side is not None
        due = self._fast is None and self._loser is not None
        if not moved and not (due and self._since_verdict >= self._retrial_after):
            return None
        self._since_verdict = 0
        self._regime.trial_began()
        self._trial = speed.Trial(side.name)
        self._trials += 1
        return self._trial

    def trials(self) -> tuple[int, bool]:
        """Trials begun in this process, and whether one runs now."""
        with self._lock:
            return self._trials, self._trial is not None

    def _timed(self, trial, side: str | None, timed: bool, call) -> TokenGroup:
        """`call()`'s group, its time noted in `trial` as `side`'s if `timed` (judging once
        it can)."""
        if not timed:
            return call()
        started = time.perf_counter()
        group = call()
        verdict = trial.record(side, time.perf_counter() - started, len(group.tokens))
        if verdict is not None:
            self._judge(trial, verdict)
        return group

    def _judge(self, trial: speed.Trial, verdict: speed.Speed) -> None:
        """The trial's verdict serves: the backend, or the reference with the backend set
        aside for the next trial; the choice says the measured ratio either way."""
        with self._lock:
            if self._trial is not trial:  # fallen back, or chosen anew, meanwhile
                return
            self._trial, self._since_verdict = None, 0
            self._regime.judged()
            fast = self._fast if self._fast is not None else self._loser
            if fast is None:  # the backend fell back meanwhile: the reference serves
                return
            why = f"{self._gate_why}; {verdict.said()}"
            if verdict.serves:
                self._fast, self._loser, self._lost = fast, None, 0
                self.choice = Choice(verdict.backend, why)
            else:
                self._loser, self._fast, self._lost = fast, None, self._lost + 1
                self._retrial_after = speed.retrial_after(verdict, self._lost)
                self.choice = Choice("reference", why)
        log.info("`tokenizer.model` %r: %s", self.reference.written, why)

    def fall_back(self, why: str) -> None:
        """The reference tokenizes from now on in this process, and later streams of the model
        skip the backend (`backends.forget`)."""
        wrong = self._fast if self._fast is not None else self._loser  # a re-trial's, too
        if wrong is not None:
            backends.forget(
                self.reference.digest(),
                wrong,
                why,
                keep=self.keep,
                reference_version=self.reference.library_version(),
            )
        self._serve(Choice("reference", why))

    def serving_backend(self) -> Backend | None:
        """The backend that encodes in this process, loaded on first use; None: the reference
        (also when the backend the gate chose will not load here: it falls back, saying why)."""
        choice = self.choice
        if choice.backend == "reference":
            return None
        fast = self._fast
        if fast is None or fast.name != choice.backend:
            try:
                fast = self.loaded_backend(choice.backend)
            except BaseException as e:
                e = _failure(e)
                self.fall_back(f"{choice.backend} would not load ({type(e).__name__}: {e})")
                return None
            self._fast = fast
        return fast

    def _counted_serving(self) -> Backend | None:
        """`serving_backend()`; while a backend loads behind the stream, the groups the
        reference begins are counted (the choice's why says how many it served)."""
        behind = self._behind
        if behind is None or behind.done.is_set():
            return self.serving_backend()
        with behind.lock:
            fast = self.serving_backend()
            if fast is None and not behind.done.is_set():
                behind.groups += 1
            return fast

    def encode(
        self, texts: list[str], first_doc: int = 0, trim_to: int | None = None
    ) -> TokenGroup:
        """`_encode`, counting the groups encoded at once (what a trial's verdict holds for)."""
        with self._lock:
            self._regime.began()
        try:
            return self._encode(texts, first_doc, trim_to)
        finally:
            with self._lock:
                self._regime.ended()

    def _encode(self, texts: list[str], first_doc: int, trim_to: int | None) -> TokenGroup:
        """The group, by the serving backend if any (one group in `audit_every`, and
        `audit_share` of the others, compared with the reference's: a difference serves the
        reference's and falls back for good), else by the reference. A backend's failure (a
        panic too) sends its group to the reference, marked `fell_back` (the stream counts it;
        the first is logged)."""
        fast = self._counted_serving()
        trial, side, timed = self._trial_side()
        if side == "backend" and fast is None:  # a re-trial of the backend set aside
            fast = self._loser
            timed = timed and fast is not None  # (unless an audit's fall-back dropped it)
        if fast is None or side == "reference":
            group = self._timed(
                trial, side, timed, lambda: self.reference_group(texts, first_doc, trim_to)
            )
            if (behind := self._behind) is not None and not behind.done.is_set():
                behind.finished_one()
            return group
        try:
            group = self._timed(
                trial, side, timed, lambda: self.backend_group(fast, texts, first_doc, trim_to)
            )
        except BaseException as e:
            _failure(e)
            if self._first_failure():
                log.warning(
                    "`tokenizer.model` %r: %s %s failed on the group of documents %d+ (%s: "
                    "%s); the reference encodes each group it fails on",
                    *(self.reference.written, fast.name, fast.version, first_doc),
                    *(type(e).__name__, e),
                )
            group = self.reference_group(texts, first_doc, trim_to)
            return dataclasses.replace(group, fell_back=True)
        group = dataclasses.replace(group, by_backend=True)
        if not self._audit_due():
            return group
        want = self.reference_group(texts, first_doc, trim_to)
        if group.same_ids(want):
            return dataclasses.replace(group, audited=True)
        why = (
            f"an audit found {fast.name} {fast.version}'s ids differ from the reference's in "
            f"the group of documents {first_doc} to {first_doc + len(texts) - 1}"
        )
        log.warning(
            "`tokenizer.model` %r: %s; the reference tokenizes from now on",
            self.reference.written,
            why,
        )
        self.fall_back(why)
        return dataclasses.replace(want, audited=True, mismatched=True, by_backend=True)

    def _first_failure(self) -> bool:
        """Counts a group the backend failed on; True for the first (the one logged)."""
        with self._lock:
            self._failed_groups += 1
            return self._failed_groups == 1

    def _audit_due(self) -> bool:
        """Whether the backend's group is audited: one in `audit_every`, and of the others
        the `audit_share` audited on the stream's spare room (which accrues a group at a
        time)."""
        if not self.audit_every:
            return False
        with self._lock:
            n, self._groups = self._groups, self._groups + 1
            if n % self.audit_every == 0:
                return True
            credit = self._audit_credit + self.audit_share
            self._audit_credit = credit - (credit >= 1.0)
            return credit >= 1.0

    def reference_group(self, texts: list[str], first_doc: int, trim_to: int | None) -> TokenGroup:
        """The group as the reference library alone makes it (long documents cut first where
        the model's cutter may)."""
        encode, cutter = self.reference.reference_ids, self.reference.cutter
        if trim_to is None or cutter is None or not cutter.cuts(texts, trim_to):
            ids = encode(texts)
        else:
            ids = cutter.encode(encode, texts, trim_to)
        return group_of(ids, first_doc, trim_to)

    def backend_group(
        self, fast: Backend, texts: list[str], first_doc: int, trim_to: int | None
    ) -> TokenGroup:
        """The group as the backend `fast` alone makes it (`serving_backend()`'s), unaudited
        (long documents cut first where the model's cutter may)."""
        cutter, spec = self.reference.cutter, self.reference.spec
        if trim_to is not None and cutter is not None and cutter.cuts(texts, trim_to):
            encode = lambda t, **flags: self._fast_ids(fast, t, **flags)  # noqa: E731
            return group_of(cutter.encode(encode, texts, trim_to), first_doc, trim_to)
        head, tail = self.reference.ends(spec.add_bos, spec.add_eos)
        return self._framed_group(fast, texts, head, tail, first_doc, trim_to)

    @staticmethod
    def _framed_group(
        fast: Backend,
        texts: list[str],
        head: list[int],
        tail: list[int],
        first_doc: int,
        trim_to: int | None,
    ) -> TokenGroup:
        """The group of `texts` by `fast`, `head` and `tail` around each text's ids (put in
        place as the backend reads its answer, where it can: `Backend.encode_framed`)."""
        flat, offsets = fast.encode_framed(texts, head, tail)
        return flat_group(flat, offsets, [], [], first_doc, trim_to)
