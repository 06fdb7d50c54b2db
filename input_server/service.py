"""The gRPC servicer: glue that validates requests, runs pipelines, maps errors to statuses."""

from __future__ import annotations

import itertools
import logging
import queue
import re
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from multiprocessing.process import BaseProcess

import grpc

from input_client._proto.input_server.v1 import input_service_pb2 as pb
from input_client._proto.input_server.v1 import input_service_pb2_grpc as pb_grpc
from input_client._queues import put_unless_stopped
from input_client.codec import PROTOCOL_VERSION, encode_state, encode_tensors, protocol_mismatch
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



class WorkerDiedError(InputServerError):
    """A worker process of the stream died (INTERNAL); the message names it."""


_STATUS = {
    InvalidSpecError: grpc.StatusCode.INVALID_ARGUMENT,
    DataNotFoundError: grpc.StatusCode.NOT_FOUND,
    RecordError: grpc.StatusCode.DATA_LOSS,
    WorkerDiedError: grpc.StatusCode.INTERNAL,
}
_POLL_S = 0.1
# How often a stream with worker processes checks that they are alive, and how long after
# finding a dead one it waits for the pipeline to unwind before ending the stream regardless.
_WATCH_S = 0.5
_UNSTICK_S = 5.0
# gRPC's Python streaming costs CPU per message on each side, mostly fixed, and more when
# messages come at a pipeline's pace than back to back: a 65,536-token message every 4 ms took
# ~325-350 µs a side (~5 ns per token), a 262,144-token one every 16 ms ~700-900 µs (~3 ns)
# (scripts/bench_grpc.py --pace-ms). So as many batches as fit this many tokens (padding
# included) travel together in one message (`Batch.following`), each whole with its own
# sequence number and state. Against 65,536 tokens a message, this size took the client 3.5-5
# ns less CPU per token and ran 1.02x (16 x 1024 batches) and 1.09x (32 x 2048) as fast through
# the server: medians of 12 and 10 paired rounds (scripts/bench_message_size.py); `serve
# --message-tokens` sets it.
# A batch waits at most COALESCE_WAIT_S for company, so a slow pipeline's batches still go
# one by one, promptly.
# At most this many batches a message, so tiny batches still flow (and show the consumer's
# pace) message by message.
MESSAGE_TOKENS = 1 << 18
MAX_BATCHES_PER_MESSAGE = 16
COALESCE_WAIT_S = 0.02
# Grain's own report of a dead worker (it names neither the worker nor its pid).
_GRAIN_WORKER_DIED = re.compile(r"Worker process was terminated unexpectedly with exit code "
                                r"(-?\d+)")


def status_of(e: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message a client sees: the error's own words, never a traceback."""
    for cls, code in _STATUS.items():
        if isinstance(e, cls):
            return code, str(e)
    return grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}"


def _exit_words(code: int) -> str:
    if code < 0:
        try:
            return f"exit code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


class StreamSession:
    """Runs one stream's pipeline on a thread, ahead of the sender by at most `depth` batches.

    The bounded queue is the backpressure: a slow client stalls the producer, so server memory
    stays flat. `stop()` (client gone, server draining) ends the thread and the Grain workers.
    With worker processes, a watchdog thread checks they are alive, so that a dead one ends the
    stream with a `WorkerDiedError` naming it (Grain's own error names neither worker nor pid)
    and, should Grain's reader never notice (a worker killed halfway through writing an
    element into its pipe leaves the reader waiting for the rest), the stream still ends.
    """

    def __init__(self, stream_id: int, name: str, stream: BatchStream, depth: int, *,
                 message_tokens: int = MESSAGE_TOKENS):
        self.stream_id = stream_id
        self.name = name
        self.stream = stream
        self.batches_sent = 0
        shape = stream.pipeline.spec.batch
        # Batches per message: as many as fit MESSAGE_TOKENS (padding included), at most
        # MAX_BATCHES_PER_MESSAGE.
        self.per_message = max(1, min(MAX_BATCHES_PER_MESSAGE,
                                      message_tokens // (shape.size * shape.seq_len)))
        self.first_sent_s: float | None = None  # time.monotonic() when the first message went
        self.first_message_batches = 0  # the batches that message held
        self.batches_produced = 0
        self.failure: WorkerDiedError | None = None
        self._failed_at = 0.0
        self._failure_lock = threading.Lock()  # the watchdog and the producer both record
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._closing = False
        self._workers_seen: dict[int, tuple[int, BaseProcess]] = {}  # pid: (index, process)
        self._thread = threading.Thread(target=self._produce, name=f"stream-{stream_id}",
                                        daemon=True)
        self._thread.start()
        if stream.workers.processes > 0:
            threading.Thread(target=self._watch, name=f"stream-{stream_id}-watch",
                             daemon=True).start()

    def _worker_died(self, which: str, code: int) -> WorkerDiedError:
        return WorkerDiedError(
            f"{which} of stream {self.stream_id} died with {_exit_words(code)}; the stream "
            f"cannot continue. Resume from the last state in a new stream; if it recurs, look "
            f"for the kernel's OOM killer (it sends SIGKILL) or a crash in the server's log.")

    def _dead_worker(self) -> WorkerDiedError | None:
        for slot, process in list(self._workers_seen.values()):
            code = process.exitcode
            # `_closing` is read after the exit code: once the stream closes, Grain's teardown
            # may kill workers itself.
            if code not in (None, 0) and not self._closing:
                return self._worker_died(f"worker process {slot + 1} of "
                                         f"{self.stream.workers.processes} (pid {process.pid})",
                                         code)
        return None

    def _record(self, failure: WorkerDiedError) -> None:
        """Keeps the stream's first dead-worker failure, and when it was found, logged once."""
        with self._failure_lock:
            if self.failure is not None:
                return
            log.warning("stream %d (%s): %s", self.stream_id, self.name, failure)
            self._failed_at = time.monotonic()
            self.failure = failure

    def _watch(self) -> None:
        while not self._stop.wait(_WATCH_S) and not self._closing:
            try:
                for slot, process in self.stream.worker_processes():
                    self._workers_seen.setdefault(process.pid, (slot, process))
            except RuntimeError:  # the graph changed under the walk; look again next time
                continue
            failure = self._dead_worker()
            if failure is not None:
                self._record(failure)
                return

    def _put(self, item) -> bool:
        return put_unless_stopped(self._queue, item, self._stop, _POLL_S)

    def _produce(self) -> None:
        last_state = b""
        next_seq = self.stream.next_seq
        vocab_size = self.stream.pipeline.tokenizer.vocab_size
        try:
            for produced in self.stream:
                last_state = encode_state(produced.state)
                next_seq = produced.seq + 1
                # The tensors are added by the sender, into the message the batch travels in
                # (alone or in another's `following`): appending a whole message copies it.
                msg = pb.Batch(sequence_number=produced.seq, state=last_state,
                               num_tokens=produced.num_tokens)
                if not self._put((msg, None, produced.batch.compact(vocab_size))):
                    return
                self.batches_produced += 1
            failure = self.failure or self._dead_worker()
            if failure is not None:  # never a clean end after a dead worker
                self._put((None, failure, None))
                return
            end = pb.Batch(sequence_number=next_seq, end_of_data=True, state=last_state)
            self._put((end, None, None))
        except Exception as e:  # surfaced to the client as a status, and logged here in full
            failure = self.failure or self._dead_worker()
            if failure is None and (m := _GRAIN_WORKER_DIED.search(str(e))):
                failure = self._worker_died("a worker process", int(m.group(1)))
            if failure is None:
                log.warning("stream %d (%s) failed", self.stream_id, self.name, exc_info=True)
            else:
                self._record(failure)
                failure = self.failure  # the watchdog's, naming the worker, if it came first
            self._put((None, failure or e, None))
        finally:
            self._closing = True
            try:
                self.stream.close()
            except Exception:  # after a dead worker, Grain's teardown may trip over its pipe
                if self.failure is None:
                    raise
                log.debug("stream %d: closing after a dead worker", self.stream_id, exc_info=True)

    def __iter__(self) -> Iterator[tuple[pb.Batch | None, BaseException | None]]:
        """Yields (message, None) or, at a failure, (None, error); polls so `stop()` is noticed.

        A message is a batch with the batches that follow it, `per_message` in all at most
        (see `_coalesce`); the end marker and errors always go alone.
        """
        pending = None  # taken from the queue while coalescing, but not joined
        while True:
            if pending is not None:
                item, pending = pending, None
            else:
                try:
                    item = self._queue.get(timeout=_POLL_S)
                except queue.Empty:
                    if self._stop.is_set() or not self._thread.is_alive() and self._queue.empty():
                        return
                    if (self.failure is not None
                            and time.monotonic() - self._failed_at > _UNSTICK_S):
                        yield None, self.failure  # the producer is still stuck in Grain
                        return
                    yield None, None  # a tick, so the caller can check for cancellation
                    continue
            msg, error, arrays = item
            if arrays is not None:
                encode_tensors(arrays, into=msg.tensors)
                if self.per_message > 1:
                    pending = self._coalesce(msg)
            yield msg, error
            if msg is None or msg.end_of_data:
                return

    def _coalesce(self, first: pb.Batch) -> tuple | None:
        """Adds to `first.following` the batches queued or arriving within COALESCE_WAIT_S,
        up to `per_message` in all; returns an item taken from the queue but not joined."""
        deadline = time.monotonic() + COALESCE_WAIT_S
        while len(first.following) + 1 < self.per_message:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            msg, _, arrays = item
            if arrays is None:  # the end marker or an error: goes alone, next
                return item
            joined = first.following.add()
            joined.CopyFrom(msg)  # no tensors yet: a few fields
            encode_tensors(arrays, into=joined.tensors)
        return None

    def consumed_batches_per_s(self) -> float:
        """Batches the client took per second since the first message: its demand, once fed."""
        if self.first_sent_s is None or self.batches_sent <= self.first_message_batches:
            return 0.0
        return ((self.batches_sent - self.first_message_batches)
                / max(time.monotonic() - self.first_sent_s, 1e-9))

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
      message_tokens: the most tokens of batches that share a message (see MESSAGE_TOKENS).
      draining: set when the server stops; streams then end with UNAVAILABLE.
    """

    def __init__(self, pipelines: Mapping[str, Pipeline], *, max_streams: int, queue_depth: int,
                 draining: threading.Event, message_tokens: int = MESSAGE_TOKENS):
        self._pipelines = dict(pipelines)
        self._slots = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams
        self._queue_depth = queue_depth
        self._message_tokens = message_tokens
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
        # Batches laid out another way would be misread (or raise out of sequence).
        refusal = protocol_mismatch(f"this server (input-server {__version__})",
                                    PROTOCOL_VERSION, request.protocol_version)
        if refusal:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
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
            session = StreamSession(stream_id, name, stream, self._queue_depth,
                                    message_tokens=self._message_tokens)
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
                session.batches_sent += 1 + len(msg.following)
                if session.first_sent_s is None:
                    session.first_sent_s = time.monotonic()
                    session.first_message_batches = session.batches_sent
        finally:
            if session is not None:
                session.stop()
                session.join(None if session.failure is None else _UNSTICK_S)
                with self._lock:
                    self._sessions.pop(session.stream_id, None)
            self._slots.release()

    def GetInfo(self, request: pb.GetInfoRequest,
                context: grpc.ServicerContext) -> pb.GetInfoResponse:
        with self._lock:
            sessions = list(self._sessions.values())
        return pb.GetInfoResponse(
            server_version=__version__,
            protocol_version=PROTOCOL_VERSION,
            pipelines={name: p.spec.to_proto() for name, p in self._pipelines.items()},
            streams=[pb.StreamInfo(stream_id=s.stream_id, pipeline=s.name,
                                   worker_processes=s.stream.workers.processes,
                                   worker_threads=s.stream.workers.threads,
                                   worker_reason=s.stream.workers.reason,
                                   batches_sent=s.batches_sent,
                                   batches_produced=s.batches_produced,
                                   worker_tuning=(s.stream.workers.tuning.to_proto()
                                                  if s.stream.workers.tuning else None),
                                   consumed_batches_per_s=s.consumed_batches_per_s())
                     for s in sessions],
        )
