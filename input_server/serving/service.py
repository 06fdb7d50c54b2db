"""The gRPC servicer: glue that validates requests, starts stream sessions, reports status.

Every exception a request meets becomes a status in one place (`guards.guard_stream` and
`guard_unary`, with `errors.status_of`): nothing escapes to gRPC, which would send UNKNOWN.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import grpc

from input_client.proto import pb, pb_grpc
from input_client.spec import PipelineSpec
from input_client.wire import PROTOCOL_VERSION, protocol_mismatch
from input_server import __version__, cancel
from input_server.autotune.online import OnlineSearch
from input_server.autotune.openings import Opening, Openings
from input_server.autotune.policy import cpu_count
from input_server.batching.meter import LiveMeter
from input_server.batching.parallelism import Parallelism, default_threads
from input_server.batching.pipeline import Pipeline
from input_server.batching.resume import Position
from input_server.batching.switching import SwitchingStream
from input_server.data.roots import DataAccess
from input_server.errors import (
    CancelledError,
    DataNotFoundError,
    InvalidSpecError,
    RefusedError,
    shorten,
)
from input_server.serving.coalesce import MESSAGE_TOKENS
from input_server.serving.credit import Credit, send_with_credit
from input_server.serving.describe import describe_tokenizer
from input_server.serving.guards import guard_stream, guard_unary, parsed
from input_server.serving.info import stream_info
from input_server.serving.limits import (
    GROUP_MIB,
    Limits,
    StreamProcesses,
    access_for,
    check_memory,
    check_workers,
    order_bytes,
    order_process_cap,
    stream_memory_mb,
)
from input_server.serving.retune import StreamTuner, end_stream
from input_server.serving.session import StreamSession
from input_server.serving.slots import ProcessPool, Slot

log = logging.getLogger(__name__)


class InputServicer(pb_grpc.InputServiceServicer):
    """Streams batches of request specs or of pipelines named at start-up.

    Args:
      pipelines: pipelines by name, already built (so their errors surfaced at start-up).
      max_streams: concurrent streams; one more gets RESOURCE_EXHAUSTED at once, never a wait.
      queue_depth: batches each stream produces ahead of the sender.
      message_tokens: the most tokens of batches that share a message (see `coalesce`).
      draining: set when the server stops; streams then end with UNAVAILABLE.
      openings: how each stream opens, by its `workers` table (the server's, with its
        remembered choices); default a new one.
      limits: what a request may read and hold; default unlimited, files of any path.
    """

    def __init__(
        self,
        pipelines: Mapping[str, Pipeline],
        *,
        max_streams: int,
        queue_depth: int,
        draining: threading.Event,
        message_tokens: int = MESSAGE_TOKENS,
        openings: Openings | None = None,
        limits: Limits | None = None,
    ):
        self._pipelines = dict(pipelines)
        self._limits = limits or Limits(
            access=DataAccess(), stream_memory_mb=float("inf"), max_workers=cpu_count() or 1
        )
        self._processes = ProcessPool(self._limits.max_workers)
        self._slots = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams
        self._queue_depth = queue_depth
        self._message_tokens = message_tokens
        self._draining = draining
        self._openings = openings or Openings()
        self._ids = itertools.count(1)
        self._sessions: dict[int, tuple[StreamSession, Credit, StreamTuner | None]] = {}
        self._handlers = 0  # StreamBatches calls from their start to their very end
        self._setting_up: dict[int, tuple[str, str]] = {}  # stream id: (pipeline, doing)
        self.max_handlers = 2 * max_streams + 2
        self._lock = threading.Lock()

    def _pipeline_of(self, request: pb.StreamBatchesRequest) -> tuple[str, Pipeline]:
        which = request.WhichOneof("pipeline")
        if which == "pipeline_name":
            name = request.pipeline_name
            if name not in self._pipelines:
                known = shorten(", ".join(sorted(self._pipelines)) or "none configured")
                raise DataNotFoundError(
                    f"`pipeline_name`: no pipeline {shorten(name)!r} (known: {known})."
                )
            return name, self._pipelines[name]
        if which != "spec":
            raise InvalidSpecError("the request names no pipeline: set `spec` or `pipeline_name`.")
        spec = PipelineSpec.from_proto(request.spec)
        self._check_fits(spec)  # before a file is opened
        access = access_for(  # with what its batches leave for its document order
            spec, self._limits, queue_depth=self._queue_depth, message_tokens=self._message_tokens
        )
        return "(request)", Pipeline(spec, access)

    def _check_fits(self, spec: PipelineSpec) -> None:
        """Refuses a spec over the server's worker cap, or over its memory budget with the
        parallelism it asks for ("auto": the least; tuning then keeps within the rest)."""
        check_workers(spec, self._limits.max_workers)
        count = spec.workers.count
        processes = 0 if count == "auto" else count
        check_memory(
            spec,
            self._limits.stream_memory_mb,
            queue_depth=self._queue_depth,
            message_tokens=self._message_tokens,
            processes=processes,
            threads=1
            if count == "auto"
            else Parallelism.fixed(count, spec.workers.threads).threads,
        )

    def _opening(self, pipeline: Pipeline, left: threading.Event, pool: StreamProcesses) -> Opening:
        """How the stream opens; its worker processes are reserved for it: a fixed count's
        waited for, "auto"'s taken from what is free (`pool`)."""
        w = pipeline.spec.workers
        if w.count != "auto":
            self._processes.take(w.count, left, self._draining)
        return self._openings.choose(
            pipeline,
            processes=pool,
            max_threads=max(1, int(self._groups_mb(pipeline) / GROUP_MIB)),
        )

    def _groups_mb(self, pipeline: Pipeline) -> float:
        """The memory a stream's groups in flight (and worker processes, measured) may use:
        its spec's `ram_budget_mb`, within what the batches and the server's copy of its
        document order leave of the server's budget for a stream."""
        spec = pipeline.spec
        order_mb = order_bytes(pipeline) / (1 << 20)
        return min(
            spec.workers.ram_budget_mb,
            self._limits.stream_memory_mb
            - order_mb
            - stream_memory_mb(
                spec,
                queue_depth=self._queue_depth,
                message_tokens=self._message_tokens,
                processes=0,
                threads=0,
            ),
        )

    def _session(
        self, stream_id: int, name: str, pipeline: Pipeline, position: Position, opening: Opening
    ) -> StreamSession:
        """The stream's session, over a batch stream that can switch its parallelism when
        its spec says "auto"."""
        p = opening.parallelism
        stream = (
            SwitchingStream(pipeline, position, p, meter=LiveMeter())
            if pipeline.spec.workers.count == "auto"
            else pipeline.stream(position, parallelism=p)
        )
        return StreamSession(
            stream_id,
            name,
            stream,
            self._queue_depth,
            message_tokens=self._message_tokens,
            reason=opening.reason,
        )

    def _live_tuner(
        self,
        pipeline: Pipeline,
        session: StreamSession,
        credit: Credit,
        opening: Opening,
        pool: StreamProcesses,
    ) -> StreamTuner:
        """The thread that tunes an "auto" stream while it serves (`serving/retune.py`)."""
        stream = session.stream
        w = pipeline.spec.workers
        search = OnlineSearch(
            stream.parallelism,
            cpus=cpu_count() or 1,
            default_threads=default_threads,
            target=float(w.target_batches_per_s),
            max_workers=w.max_workers,
            ram_budget_mb=self._groups_mb(pipeline),
            tune_seconds=float(w.tune_seconds),
            remembered=opening.remembered,
            mb_per_worker=GROUP_MIB,
        )
        return StreamTuner(
            stream,
            search,
            processes=pool,
            reserved=opening.parallelism.processes,
            taken=lambda: credit.taken_or(session.batches_sent),
            remember=functools.partial(self._openings.remember, pipeline),
            reason=opening.reason,
        )

    @guard_stream
    def StreamBatches(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[pb.Batch]:
        # The first request names the pipeline; the later ones are the client's credit.
        try:
            request = parsed(pb.StreamBatchesRequest, next(requests))
        except StopIteration:
            raise InvalidSpecError("the stream carried no request.") from None
        # Batches laid out another way would be misread (or raise out of sequence).
        refusal = protocol_mismatch(
            f"this server (input-server {__version__})", PROTOCOL_VERSION, request.protocol_version
        )
        if refusal:
            raise RefusedError(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        if self._draining.is_set():
            raise RefusedError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down.")
        with self._lock:
            # Streams whose client left free their slot at once but keep a thread while their
            # set-up or teardown finishes: at most `max_handlers` in all, so that health and
            # info always find one of the server's threads.
            busy = self._handlers >= self.max_handlers
            if not busy:
                self._handlers += 1
        if busy:
            raise RefusedError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the server is still closing streams of clients that left; retry shortly.",
            )
        credit = Credit(request.window)
        credit.follow(requests)
        try:
            yield from self._stream(request, context, credit)
        finally:
            with self._lock:
                self._handlers -= 1

    def _stream(
        self, request: pb.StreamBatchesRequest, context: grpc.ServicerContext, credit: Credit
    ) -> Iterator[pb.Batch]:
        slot = Slot(self._slots)
        if not slot.take():
            raise RefusedError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server already runs its maximum of {self._max_streams} streams.",
            )
        # Set when the client leaves (cancel, deadline, disconnect): every blocking step of
        # the set-up checks it (`cancel.check`), and the stream slot frees at once, before a
        # reconnecting client arrives; the teardown goes on in this thread.
        left = threading.Event()
        session: StreamSession | None = None

        def on_leave() -> None:
            left.set()
            slot.give()
            if session is not None:
                session.stop()

        if not context.add_callback(on_leave):
            on_leave()
        reserved = 0
        live: StreamTuner | None = None
        # Listed by info from its first moment, with what its set-up is doing.
        stream_id = next(self._ids)
        shown = (
            request.pipeline_name
            if request.WhichOneof("pipeline") == "pipeline_name"
            else "(request)"
        )
        self._set_up(stream_id, shown, "opening its files and model")
        pipeline: Pipeline | None = None
        try:
            try:
                with cancel.scope(left, self._draining):
                    cancel.check()
                    name, pipeline = self._pipeline_of(request)
                    # The state first: a request refused for it never waits for (or holds) a tuning.
                    position = pipeline.parse_state(request.resume_state)
                    self._set_up(stream_id, shown, "choosing its workers")
                    # An "auto" stream's processes: no more than copies of its order fit.
                    cap = order_process_cap(order_bytes(pipeline), self._groups_mb(pipeline))
                    pool = StreamProcesses(self._processes, cap)
                    opening = self._opening(pipeline, left, pool)
                    reserved = opening.parallelism.processes
                    cancel.check()
            except CancelledError:
                if self._draining.is_set() and not left.is_set():  # the client may resume
                    raise RefusedError(
                        grpc.StatusCode.UNAVAILABLE, "the server is shutting down."
                    ) from None
                raise
            session = self._session(stream_id, name, pipeline, position, opening)
            if pipeline.spec.workers.count == "auto":  # tuned while it serves
                live = self._live_tuner(pipeline, session, credit, opening, pool).start()
            with self._lock:
                self._sessions[stream_id] = (session, credit, live)
                self._setting_up.pop(stream_id, None)
            if left.is_set():
                session.stop()
            log.info(
                "stream %d (%s): %d worker processes, %d threads (%s)",
                stream_id,
                session.label,
                opening.parallelism.processes,
                opening.parallelism.threads,
                opening.reason,
            )
            yield from send_with_credit(session, context, credit, self._draining)
        finally:
            slot.give()
            reserved = end_stream(session, live, reserved)
            with self._lock:
                self._setting_up.pop(stream_id, None)
                self._sessions.pop(stream_id, None)
            self._processes.give(reserved)
            if pipeline is not None and request.WhichOneof("pipeline") == "spec":
                pipeline.close()  # a request's own pipeline ends here; a named one keeps its text

    def _set_up(self, stream_id: int, name: str, doing: str) -> None:
        with self._lock:
            self._setting_up[stream_id] = (name, doing)

    def active_requests(self) -> int:
        """Streams being set up, running or closing."""
        with self._lock:
            return self._handlers

    @guard_unary(pb.Tokenizer)
    def DescribeTokenizer(
        self, request: pb.Tokenizer, context: grpc.ServicerContext
    ) -> pb.TokenizerInfo:
        return describe_tokenizer(request, self._limits.access)

    @guard_unary(pb.GetInfoRequest)
    def GetInfo(
        self, request: pb.GetInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetInfoResponse:
        with self._lock:
            sessions = list(self._sessions.values())
            setting_up = [
                pb.StreamInfo(stream_id=i, pipeline=name, worker_reason=f"setting up: {doing}")
                for i, (name, doing) in sorted(self._setting_up.items())
            ]
        return pb.GetInfoResponse(
            server_version=__version__,
            protocol_version=PROTOCOL_VERSION,
            pipelines={name: p.spec.to_proto() for name, p in self._pipelines.items()},
            streams=[*setting_up, *(stream_info(*s) for s in sessions)],
        )


def add_to_server(servicer: InputServicer, server: grpc.Server) -> None:
    """Registers `servicer` taking its requests as bytes, parsed inside its guard: gRPC's own
    parsing answers a request that does not parse with INTERNAL ("Exception deserializing
    request!"), out of the guard's reach, and grpcio 1.85 then keeps ~17 KB per such request."""
    handlers = {
        "StreamBatches": grpc.stream_stream_rpc_method_handler(
            servicer.StreamBatches, response_serializer=pb.Batch.SerializeToString
        ),
        "GetInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetInfo, response_serializer=pb.GetInfoResponse.SerializeToString
        ),
        "DescribeTokenizer": grpc.unary_unary_rpc_method_handler(
            servicer.DescribeTokenizer, response_serializer=pb.TokenizerInfo.SerializeToString
        ),
    }
    name = pb.DESCRIPTOR.services_by_name["InputService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
