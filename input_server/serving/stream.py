"""One stream, end to end: `Stream` makes what a StreamBatches call holds, sends its messages,
reports its figures and gives it all back, in one place, once.

What one stream holds, in the order it is made: its credit (the client's later requests,
read on a thread, which ends with the call), its pipeline (a request's own, closed at the end;
a named one is the server's), the worker processes reserved for it, its producer
(`session.StreamSession`, over a `BatchStream`: a fixed count's is one that is never
switched) and, for "auto", its live tuner (`retune.StreamTuner`); `close` gives back all but
the credit, in reverse. Its stream slot is the registry's (`streams.Streams.admit`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from input_client.proto import pb
from input_client.spec import PipelineSpec
from input_client.wire import CLIENT_KEY
from input_server import cancel
from input_server.autotune import report
from input_server.autotune.online import OnlineSearch
from input_server.autotune.openings import Opening, Openings
from input_server.autotune.policy import cpu_count
from input_server.batching.batch_stream import BatchStream
from input_server.batching.budget import StreamBudget
from input_server.batching.pacing import Key, caller
from input_server.batching.parallelism import default_threads
from input_server.batching.pipeline import Pipeline
from input_server.errors import (
    CancelledError,
    DataNotFoundError,
    InvalidSpecError,
    RefusedError,
    shorten,
)
from input_server.serving.accounting import Accounting, log_open, tokenizer_figures
from input_server.serving.backoff import LoopbackOwners, peer_key
from input_server.serving.credit import Credit
from input_server.serving.limits import Limits, access_for, admit, budget_for
from input_server.serving.retune import StreamTuner
from input_server.serving.session import (
    REQUEST,
    TICK_S,
    UNSTICK_S,
    StreamSession,
    describe_request,
)
from input_server.serving.slots import ProcessPool, ProcessReservation

# Loopback peers of the set-up queue are told apart by the user owning their socket, as the
# token check tells them apart (`backoff.peer_key`).
_OWNERS = LoopbackOwners()
# The longest client name the set-up queue keeps of a call's header (the client sends a short
# random one): a longer one is cut, so that a call cannot make the queue hold much text.
CLIENT_KEY_CHARS = 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shared:
    """What a server's streams share, and what each is made with (see `InputServicer`)."""

    pipelines: Mapping[str, Pipeline]
    limits: Limits
    queue_depth: int
    message_tokens: int
    # What a request's pipeline is made with beyond its spec: `Pipeline`'s audit_every,
    # token_cache, tokenizer_cache and load_behind.
    pipeline_options: Mapping[str, Any]
    draining: threading.Event
    openings: Openings
    processes: ProcessPool


def _draining_refusal() -> RefusedError:
    return RefusedError(
        grpc.StatusCode.UNAVAILABLE, "the server is shutting down; resume from the last state."
    )


def _call_if_alive(method: weakref.WeakMethod) -> None:
    bound = method()
    if bound is not None:
        bound()


class Stream:
    """One StreamBatches call's stream, from its request to its last message.

    `open()` sets it up (its pipeline, state, workers, producer, tuner), `messages()` yields
    its messages as the client's credit allows, `info()` reports it (while it sets up, too),
    `close()` (or leaving its `with`) gives back everything it made, in reverse order, once.

    Args:
      stream_id: its id in `input-server info`.
      request: the call's first request; `requests` the later ones (the client's credit).
      context: the call's; the client leaving (cancel, deadline, disconnect) stops every
        blocking step of the set-up (`cancel.check`) and the sender at once, and calls
        `on_leave` (the registry frees its slot before a reconnecting client arrives).
      shared: what the server's streams share.
    """

    def __init__(
        self,
        stream_id: int,
        request: pb.StreamBatchesRequest,
        requests: Iterator[Any],
        context: grpc.ServicerContext,
        shared: Shared,
        *,
        on_leave: Callable[[], None] = lambda: None,
    ):
        self.id = stream_id
        self._request = request
        self._context = context
        self._shared = shared
        self._on_leave = on_leave
        named = request.WhichOneof("pipeline") == "pipeline_name"
        self._name = request.pipeline_name if named else REQUEST
        self._lock = threading.Lock()
        self._doing = "opening its files and model"
        self._left = threading.Event()
        self._held = contextlib.ExitStack()  # what it made, closed in reverse
        self._opening: Opening | None = None
        self.session: StreamSession | None = None
        self.accounting: Accounting | None = None  # its figures, once it runs
        self._live: StreamTuner | None = None
        # The credit calls back weakly: a bound method would make the stream and its credit a
        # cycle that only the garbage collector frees, and until then gRPC core counts the
        # cancelled call against the connection's concurrent streams (new calls refused).
        interrupt = weakref.WeakMethod(self._interrupt)
        self.credit = Credit(request.window, on_fail=lambda: _call_if_alive(interrupt))
        self.credit.follow(requests)
        if not context.add_callback(self._leave):
            self._leave()

    def _leave(self) -> None:
        self._left.set()
        self._on_leave()
        self._interrupt()

    def _interrupt(self) -> None:
        """Stops the producer and wakes the sender: the client left, the server drains, or a
        credit report broke the contract (`messages` then ends with the status that says so)."""
        session = self.session
        if session is not None:
            session.stop()
        self.credit.wake()

    def drain(self) -> None:
        """The server drains (its `draining` event is set): the stream ends with UNAVAILABLE
        now, not at its next batch."""
        self._interrupt()

    def _set_up(self, doing: str) -> None:
        with self._lock:
            self._doing = doing

    @property
    def left(self) -> bool:
        """The client left (cancel, deadline, disconnect), whichever step noticed first."""
        return self._left.is_set() or not self._context.is_active()

    @property
    def setting_up(self) -> bool:
        return self.session is None

    def open(self) -> None:
        """Sets the stream up: its pipeline, the state it resumes from, its workers (reserved
        for it), its producer and, for "auto", its live tuner.

        Raises:
          InputServerError: the request cannot be served (its status says why).
          CancelledError: the client left meanwhile.
        """
        shared = self._shared
        try:
            with cancel.scope(self._left, shared.draining), caller(self._pace_key):
                cancel.check()
                pipeline, budget = self._pipeline()
                # The state first: a request refused for it must not wait for (or hold) a
                # tuning.
                position = pipeline.parse_state(self._request.resume_state)
                self._set_up("choosing its workers")
                # An "auto" stream's processes: no more than copies of its order fit.
                budget = budget.reading(pipeline, position)
                processes = ProcessReservation(shared.processes, budget)
                self._held.callback(processes.close)
                opening = self._reserve(pipeline, processes, budget)
                cancel.check()
        except CancelledError:
            if shared.draining.is_set() and not self._left.is_set():  # the client may resume
                raise RefusedError(
                    grpc.StatusCode.UNAVAILABLE, "the server is shutting down."
                ) from None
            raise
        auto = pipeline.spec.workers.count == "auto"
        batches = BatchStream(pipeline, position, opening.parallelism)
        try:
            session = StreamSession(
                self.id,
                self._name,
                batches,
                shared.queue_depth,
                message_tokens=shared.message_tokens,
                switched=auto,
            )
        except BaseException:  # no producer, so none to close its batches
            batches.close()
            raise
        self._held.callback(self._end_session, session)
        live = None
        if auto:
            live = self._live_tuner(pipeline, batches, opening, processes, budget).start()
        if live is not None:
            self._held.callback(self._end_tuner, live)
        most = min(
            pipeline.spec.workers.max_workers or shared.limits.max_workers,
            shared.limits.max_workers,
        )
        accounting = Accounting(self.id, session, self.credit, max_workers=most)
        with self._lock:
            self._opening, self._live, self.session = opening, live, session
            self.accounting = accounting
        if self._left.is_set() or shared.draining.is_set():  # `_interrupt` found no producer
            session.stop()
        log_open(self.id, pipeline, session.label, opening, position)

    def _pace_key(self) -> Key:
        """Whom this stream's set-up is fair to in the server's set-up queue (`pacing`): its
        peer as the token check tells peers apart (a TCP host, a loopback user, every Unix
        socket as one), then within it the client process it names (`wire.CLIENT_KEY`), or
        else its connection (a TCP peer's port; all of a Unix socket's as one)."""
        peer = self._context.peer()
        named = dict(self._context.invocation_metadata() or ()).get(CLIENT_KEY)
        client = f"client {named[:CLIENT_KEY_CHARS]}" if isinstance(named, str) and named else peer
        return peer_key(peer, _OWNERS), client

    def _pipeline(self) -> tuple[Pipeline, StreamBudget]:
        """The pipeline the request names, or one made of its spec (closed with the stream),
        and the stream's memory budget (`limits.admit`)."""
        request, shared = self._request, self._shared
        shape = {"queue_depth": shared.queue_depth, "message_tokens": shared.message_tokens}
        which = request.WhichOneof("pipeline")
        if which == "pipeline_name":
            name = request.pipeline_name
            if name not in shared.pipelines:
                known = shorten(", ".join(sorted(shared.pipelines)) or "none configured")
                raise DataNotFoundError(
                    f"`pipeline_name`: no pipeline {shorten(name)!r} (known: {known})."
                )
            pipeline = shared.pipelines[name]
            return pipeline, budget_for(pipeline.spec, shared.limits, **shape)
        if which != "spec":
            raise InvalidSpecError("the request names no pipeline: set `spec` or `pipeline_name`.")
        spec = PipelineSpec.from_proto(request.spec)
        budget, model = admit(spec, shared.limits, **shape)  # before a file is opened
        # With what its batches leave for its document order, its model as found.
        access = access_for(budget, shared.limits.access)
        pipeline = Pipeline(spec, access, model=model, **shared.pipeline_options)
        self._held.callback(pipeline.close)  # a named one keeps its text
        return pipeline, budget

    def _reserve(
        self, pipeline: Pipeline, processes: ProcessReservation, budget: StreamBudget
    ) -> Opening:
        """How the stream opens; its worker processes are reserved for it (`processes`,
        given back by `close`): a fixed count's waited for, "auto"'s taken from what is free."""
        shared, w = self._shared, pipeline.spec.workers
        if w.count != "auto":
            processes.take(w.count, self._left, shared.draining)
        return shared.openings.choose(pipeline, processes=processes, budget=budget)

    def _live_tuner(
        self,
        pipeline: Pipeline,
        batches: BatchStream,
        opening: Opening,
        processes: ProcessReservation,
        budget: StreamBudget,
    ) -> StreamTuner:
        """The thread that tunes an "auto" stream while it serves (`serving/retune.py`)."""
        w = pipeline.spec.workers
        search = OnlineSearch(
            batches.parallelism,
            cpus=cpu_count() or 1,
            default_threads=default_threads,
            target=float(w.target_batches_per_s),
            max_workers=w.max_workers,
            tune_seconds=float(w.tune_seconds),
            remembered=opening.remembered,
            budget=budget,
        )
        return StreamTuner(
            batches,
            search,
            processes=processes,
            taken=self.credit.taken_so_far,
            remember=functools.partial(self._shared.openings.remember, pipeline),
            reason=opening.reason,
            stream_id=self.id,
            trials=pipeline.tokenizer.trials,
            waited=lambda: self.credit.exposed_wait()[0],
        )

    def messages(self) -> Iterator[pb.Batch]:
        """The stream's messages as the client's credit allows them (`Credit`), ending when
        the client leaves, refusing with UNAVAILABLE once the server drains."""
        session, credit = self.session, self.credit
        assert session is not None, "open() first"
        draining, context = self._shared.draining, self._context
        meter = session.stream.meter
        shape = session.stream.pipeline.spec.batch
        per_batch = shape.size * shape.seq_len
        for msg, error in session:
            if draining.is_set():
                raise _draining_refusal()
            if error is not None:
                if not isinstance(error, Exception):  # e.g. SystemExit from a library
                    raise RuntimeError(f"{type(error).__name__}: {error}") from error
                raise error
            if msg is None:
                if not context.is_active():
                    return
                credit.check()
                continue
            started = time.perf_counter()
            while not credit.allows(credit.sent, TICK_S):
                if draining.is_set():
                    raise _draining_refusal()
                if not context.is_active():
                    return
            credit.check()  # a report that broke the contract ends the stream here
            batches = 1 + len(msg.following)
            credit.offer(credit.sent + batches)
            yielded = time.perf_counter()
            meter.add("credit_wait", yielded - started)
            self.accounting.tick()
            yield msg
            real = msg.num_tokens + sum(b.num_tokens for b in msg.following)
            meter.sent(
                msg.ByteSize(),
                time.perf_counter() - yielded,
                real=real,
                padding=0 if msg.end_of_data else batches * per_batch - real,
            )
            credit.sent_message(batches)
            if msg.end_of_data:
                return
        # The producer was stopped before its end (`_interrupt`): say why, unless the client
        # left (nobody reads it).
        credit.check()
        if draining.is_set():
            raise _draining_refusal()

    def info(self) -> pb.StreamInfo:
        """What `input-server info` shows of the stream, the one source of its figures."""
        with self._lock:
            session, live, opening, doing = self.session, self._live, self._opening, self._doing
        if session is None or opening is None:
            return pb.StreamInfo(
                stream_id=self.id,
                pipeline=describe_request(self._name, self._request.spec),
                worker_reason=f"setting up: {doing}",
            )
        parallelism = session.stream.parallelism
        credit = self.credit
        tuning = live.search.tuning if live is not None else None  # a fixed count has none
        info = pb.StreamInfo(
            stream_id=self.id,
            pipeline=session.label,
            worker_processes=parallelism.processes,
            worker_threads=parallelism.threads,
            worker_reason=live.reason if live else opening.reason,
            batches_sent=credit.sent,
            batches_produced=session.batches_produced,
            worker_tuning=report.tuning_proto(tuning) if tuning else None,
            consumed_batches_per_s=credit.pace(),
            batches_taken=credit.taken_so_far(),
        )
        info.stats.CopyFrom(self.accounting.stats())
        tokenizer_figures(info, session.stream)
        if live is not None:
            info.tuning_state = live.state
            info.demand_batches_per_s = live.demand
            info.switches.extend(report.switch_proto(w) for w in list(live.history))
        return info

    def _end_tuner(self, live: StreamTuner) -> None:
        live.stop()
        live.join()  # it waits on its stop event, and on a switch being made (not withdrawable)

    @staticmethod
    def _end_session(session: StreamSession) -> None:
        session.stop()
        session.join(None if session.failure is None else UNSTICK_S)

    def close(self) -> None:
        """Gives back what the stream made, in reverse order: its tuner, its producer (and
        with it its batches and worker processes), its reserved processes, its own pipeline.
        Idempotent."""
        self._held.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
