"""The gRPC servicer: glue that validates requests, runs pipelines, maps errors to statuses."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Iterator, Mapping

import grpc

from input_client._proto.input_server.v1 import input_service_pb2 as pb
from input_client._proto.input_server.v1 import input_service_pb2_grpc as pb_grpc
from input_client.codec import encode_state, encode_tensors
from input_client.spec import PipelineSpec, SpecError
from input_server import __version__
from input_server.errors import (
    DataNotFoundError,
    InputServerError,
    InvalidSpecError,
    RecordError,
)
from input_server.pipeline import BatchStream, Pipeline

log = logging.getLogger(__name__)

_STATUS = {
    InvalidSpecError: grpc.StatusCode.INVALID_ARGUMENT,
    DataNotFoundError: grpc.StatusCode.NOT_FOUND,
    RecordError: grpc.StatusCode.DATA_LOSS,
}
_POLL_S = 0.1


def status_of(e: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message a client sees: the error's own words, never a traceback."""
    for cls, code in _STATUS.items():
        if isinstance(e, cls):
            return code, str(e)
    return grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}"


class StreamSession:
    """Runs one stream's pipeline on a thread, ahead of the sender by at most `depth` batches.

    The bounded queue is the backpressure: a slow client stalls the producer, so server memory
    stays flat. `stop()` (client gone, server draining) ends the thread and the Grain workers.
    """

    def __init__(self, stream_id: int, name: str, stream: BatchStream, depth: int):
        self.stream_id = stream_id
        self.name = name
        self.stream = stream
        self.batches_sent = 0
        self.batches_produced = 0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=f"stream-{stream_id}",
                                        daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        last_state = b""
        next_seq = self.stream.next_seq
        try:
            for produced in self.stream:
                last_state = encode_state(produced.state)
                next_seq = produced.seq + 1
                msg = pb.Batch(sequence_number=produced.seq,
                               tensors=encode_tensors(produced.arrays),
                               state=last_state, num_tokens=produced.num_tokens)
                if not self._put((msg, None)):
                    return
                self.batches_produced += 1
            end = pb.Batch(sequence_number=next_seq, end_of_data=True, state=last_state)
            self._put((end, None))
        except Exception as e:  # surfaced to the client as a status, and logged here in full
            log.warning("stream %d (%s) failed", self.stream_id, self.name, exc_info=True)
            self._put((None, e))
        finally:
            self.stream.close()

    def __iter__(self) -> Iterator[tuple[pb.Batch | None, BaseException | None]]:
        """Yields (batch, None) or, at a failure, (None, error); polls so `stop()` is noticed."""
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._stop.is_set() or not self._thread.is_alive() and self._queue.empty():
                    return
                yield None, None  # a tick, so the caller can check for cancellation
                continue
            yield item
            if item[0] is None or item[0].end_of_data:
                return

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


class InputServicer(pb_grpc.InputServiceServicer):
    """Streams batches of request specs or of pipelines named at start-up.

    Args:
      pipelines: pipelines by name, already built (so their errors surfaced at start-up).
      max_streams: concurrent streams; one more gets RESOURCE_EXHAUSTED at once, never a wait.
      queue_depth: batches each stream produces ahead of the sender.
      draining: set when the server stops; streams then end with UNAVAILABLE.
    """

    def __init__(self, pipelines: Mapping[str, Pipeline], *, max_streams: int, queue_depth: int,
                 draining: threading.Event):
        self._pipelines = dict(pipelines)
        self._slots = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams
        self._queue_depth = queue_depth
        self._draining = draining
        self._ids = itertools.count(1)
        self._sessions: dict[int, StreamSession] = {}
        self._lock = threading.Lock()

    def _pipeline_of(self, request: pb.StreamBatchesRequest) -> tuple[str, Pipeline]:
        which = request.WhichOneof("pipeline")
        if which == "pipeline_name":
            name = request.pipeline_name
            if name not in self._pipelines:
                known = ", ".join(sorted(self._pipelines)) or "none configured"
                raise DataNotFoundError(f"`pipeline_name`: no pipeline {name!r} (known: {known}).")
            return name, self._pipelines[name]
        if which != "spec":
            raise InvalidSpecError("the request names no pipeline: set `spec` or `pipeline_name`.")
        try:
            spec = PipelineSpec.from_proto(request.spec)
        except SpecError as e:
            raise InvalidSpecError(str(e)) from e
        return "(request)", Pipeline(spec)

    def StreamBatches(self, request: pb.StreamBatchesRequest,
                      context: grpc.ServicerContext) -> Iterator[pb.Batch]:
        if self._draining.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down.")
        if not self._slots.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the server already runs its maximum of {self._max_streams} streams.")
        session = None
        try:
            try:
                name, pipeline = self._pipeline_of(request)
                stream = pipeline.stream(request.resume_state)
            except InputServerError as e:
                context.abort(*status_of(e))
            stream_id = next(self._ids)
            session = StreamSession(stream_id, name, stream, self._queue_depth)
            with self._lock:
                self._sessions[stream_id] = session
            context.add_callback(session.stop)  # called when the client cancels or disconnects
            log.info("stream %d (%s): %d worker processes, %d threads (%s)", stream_id, name,
                     stream.workers.processes, stream.workers.threads, stream.workers.reason)
            for msg, error in session:
                if self._draining.is_set():
                    context.abort(grpc.StatusCode.UNAVAILABLE,
                                  "the server is shutting down; resume from the last state.")
                if error is not None:
                    context.abort(*status_of(error))
                if msg is None:
                    if not context.is_active():
                        return
                    continue
                yield msg
                session.batches_sent += 1
        finally:
            if session is not None:
                session.stop()
                session.join()
                with self._lock:
                    self._sessions.pop(session.stream_id, None)
            self._slots.release()

    def GetInfo(self, request: pb.GetInfoRequest,
                context: grpc.ServicerContext) -> pb.GetInfoResponse:
        with self._lock:
            sessions = list(self._sessions.values())
        return pb.GetInfoResponse(
            server_version=__version__,
            pipelines={name: p.spec.to_proto() for name, p in self._pipelines.items()},
            streams=[pb.StreamInfo(stream_id=s.stream_id, pipeline=s.name,
                                   worker_processes=s.stream.workers.processes,
                                   worker_threads=s.stream.workers.threads,
                                   worker_reason=s.stream.workers.reason,
                                   batches_sent=s.batches_sent,
                                   batches_produced=s.batches_produced) for s in sessions],
        )
