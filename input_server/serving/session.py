"""One stream's session: its pipeline produces on a thread, a watchdog checks its workers."""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess

from input_client.proto import pb
from input_client.threads import Prefetcher
from input_client.wire import encode_state
from input_server.batching.batch_stream import ServedStream
from input_server.errors import InputServerError, WorkerDiedError, exit_words
from input_server.serving import memory
from input_server.serving.audit_pace import AuditPace
from input_server.serving.coalesce import MESSAGE_TOKENS, Queued, batches_per_message, coalesce

log = logging.getLogger(__name__)

# The longest the sender waits for a batch before it looks again at the client, the server
# and the watchdog: a safety net, not a poll (`Stream` stops the producer, which wakes the
# sender, when the client leaves, the server drains or a credit report breaks the contract).
TICK_S = 1.0
# How often a stream with worker processes checks that they are alive, and how long after
# finding a dead one it waits for the pipeline to unwind before ending the stream regardless.
_WATCH_S = 0.5
UNSTICK_S = 5.0
# Grain's own report of a dead worker (it names neither the worker nor its pid).
_GRAIN_WORKER_DIED = re.compile(
    r"Worker process was terminated unexpectedly with exit code "
    r"(-?\d+)"
)


# The name a stream whose client sent its spec has inside the server, never shown: `describe`
# labels such a stream by its data and model wherever it is shown (`info`, the log).
REQUEST = "(request)"


def describe(name: str, spec) -> str:
    """What `info` and the log call a stream: its pipeline's name, or for a spec the client
    sent, its data (first path, how many more) and model, e.g. "request: docs.jsonl, spm.model"
    ("(request)" alone named none of a server's many such streams)."""
    if name != REQUEST:
        return name
    return _label([p for source in spec.sources for p in source.paths], spec.tokenizer.model)


def describe_request(name: str, spec: pb.PipelineSpec) -> str:
    """`describe` of a stream still setting up, from the spec as the client sent it (nothing of
    it checked yet): the label it keeps once it runs, where "(request)" showed before."""
    if name != REQUEST:
        return name
    sources = list(spec.mixture) or [spec.source]
    return _label([p for source in sources for p in source.paths], spec.tokenizer.model)


def _label(paths: list[str], model: str) -> str:
    """ "request: FIRST-PATH [+N], MODEL", of their base names."""
    data = os.path.basename(paths[0]) if paths else "?"
    if len(paths) > 1:
        data += f" +{len(paths) - 1}"
    return f"request: {data}" + (f", {os.path.basename(model.rstrip('/'))}" if model else "")


class StreamSession:
    """Runs one stream's pipeline on a thread, ahead of the sender by at most `depth` batches.

    The bounded queue is the backpressure: a slow client stalls the producer, so server memory
    stays flat. `stop()` (client gone, server draining) ends the thread and the Grain workers.
    With worker processes, a watchdog thread checks they are alive, so that a dead one ends the
    stream with a `WorkerDiedError` naming it (Grain's own error names neither worker nor pid)
    and, should Grain's reader never notice (a worker killed halfway through writing an
    element into its pipe leaves the reader waiting for the rest), the stream still ends.

    Args:
      stream_id, name: the stream's id and pipeline name (`describe` makes its label).
      stream: its batches (a fixed count's stream is one that is never switched).
      depth: batches produced ahead of the sender.
      message_tokens: the most tokens of batches that share a message (see `coalesce`).
      switched: whether the stream may be switched (an "auto" one): then it is watched even
        while it runs no worker process, since a switch may start some.
    """

    def __init__(
        self,
        stream_id: int,
        name: str,
        stream: ServedStream,
        depth: int,
        *,
        message_tokens: int = MESSAGE_TOKENS,
        switched: bool = False,
    ):
        self.stream_id = stream_id
        self.name = name
        self.label = describe(name, stream.pipeline.spec)
        self.stream = stream
        shape = stream.pipeline.spec.batch
        self.per_message = batches_per_message(shape.size, shape.seq_len, message_tokens)
        self.depth = depth
        self.batches_produced = 0
        self.failure: WorkerDiedError | None = None
        self._failed_at = 0.0
        self._failure_lock = threading.Lock()  # the watchdog and the producer both record
        self._closing = False
        # pid: (the stage's generation, index, process)
        self._workers_seen: dict[int, tuple[int, int, BaseProcess]] = {}
        memory.stream_started()  # ended by the producer: the last end gives memory back
        try:
            self._producer = Prefetcher(self._produce, depth=depth, name=f"stream-{stream_id}")
        except BaseException:  # no thread, so no producer to count the end
            memory.stream_ended()
            raise
        if stream.parallelism.processes > 0 or switched:
            try:
                threading.Thread(
                    target=self._watch, name=f"stream-{stream_id}-watch", daemon=True
                ).start()
            except BaseException:  # no watchdog ("can't start new thread"): no producer either
                self.stop()
                self.join()  # its end closes the stream
                raise

    def _worker_died(self, which: str, code: int) -> WorkerDiedError:
        return WorkerDiedError(
            f"{which} of stream {self.stream_id} died with {exit_words(code)}; the stream "
            f"cannot continue. Resume from the last state in a new stream; if it recurs, look "
            f"for the kernel's OOM killer (it sends SIGKILL) or a crash in the server's log."
        )

    def _generation(self) -> int:
        """Which parallel stage runs now: a live-tuned stream's switches so far (the workers
        of a stage it switched away from are stopped, not dead)."""
        return self.stream.switches

    def _dead_worker(self) -> WorkerDiedError | None:
        generation = self._generation()
        for seen_in, slot, process in list(self._workers_seen.values()):
            if seen_in != generation:
                continue
            code = process.exitcode
            # `_closing` is read after the exit code: once the stream closes, Grain's teardown
            # may kill workers itself.
            if code not in (None, 0) and not self._closing:
                return self._worker_died(
                    f"worker process {slot + 1} of "
                    f"{self.stream.parallelism.processes} (pid {process.pid})",
                    code,
                )
        return None

    def _record(self, failure: WorkerDiedError) -> None:
        """Keeps the stream's first dead-worker failure, and when it was found, logged once."""
        with self._failure_lock:
            if self.failure is not None:
                return
            log.warning("stream %d (%s): %s", self.stream_id, self.label, failure)
            self._failed_at = time.monotonic()
            self.failure = failure

    def _watch(self) -> None:
        while not self._producer.wait_stopped(_WATCH_S) and not self._closing:
            if self.stream.parallelism.in_process:  # nothing to watch now
                continue
            generation = self._generation()
            try:
                found = self.stream.worker_processes()
            except RuntimeError:  # the graph changed under the walk; look again next time
                continue
            if self._generation() != generation:  # switched under the walk: which stage's?
                continue
            for slot, process in found:
                self._workers_seen.setdefault(process.pid, (generation, slot, process))
            failure = self._dead_worker()
            # A switch counts before it stops the old stage's workers: one that began meanwhile
            # may have stopped them.
            if failure is not None and self._generation() == generation:
                self._record(failure)
                return

    def _produce(self, put: Callable[[Queued], bool]) -> None:
        """The producer: each batch's message (tensors added by the sender, into the message
        the batch travels in) and wire arrays, then the end marker; raises what ends it."""
        last_state = b""
        next_seq = self.stream.next_seq
        tokenizer = self.stream.pipeline.tokenizer
        vocab_size = tokenizer.vocab_size
        meter = self.stream.meter
        pace = AuditPace() if tokenizer.choice is not None else None  # not pre-tokenized
        try:
            for produced in self.stream:
                started = time.perf_counter()
                last_state = encode_state(produced.state)
                next_seq = produced.seq + 1
                msg = pb.Batch(
                    sequence_number=produced.seq, state=last_state, num_tokens=produced.num_tokens
                )
                item = (msg, produced.batch.compact(vocab_size))
                waited = time.perf_counter()
                meter.add("encode", waited - started)
                if not put(item):
                    return
                # The time it waited for room: the loop's pace, for a live tuner, and room
                # to audit every group while it waits.
                blocked = time.perf_counter() - waited
                meter.batch(produced.num_tokens, blocked)
                if pace is not None:
                    tokenizer.audit_share = pace.waited(blocked)
                self.batches_produced += 1
            failure = self.failure or self._dead_worker()
            if failure is not None:  # never a clean end after a dead worker
                raise failure
            put((pb.Batch(sequence_number=next_seq, end_of_data=True, state=last_state), None))
        except WorkerDiedError:
            raise
        except Exception as e:  # surfaced to the client as a status, and logged here in full
            failure = self.failure or self._dead_worker()
            if failure is None and (m := _GRAIN_WORKER_DIED.search(str(e))):
                failure = self._worker_died("a worker process", int(m.group(1)))
            if failure is None:
                # A status the request or the data earned says all in one line (a fuzzer's
                # tampered states wrote a 20-line traceback each); anything else in full.
                said = isinstance(e, InputServerError)
                log.warning(
                    "stream %d (%s) failed" + (": %s" if said else ""),
                    *(self.stream_id, self.label, *([e] if said else [])),
                    exc_info=not said,
                )
                raise
            self._record(failure)
            raise self.failure from e  # the watchdog's, naming the worker, if it came first
        finally:
            self._closing = True
            try:
                self.stream.close()
            except Exception:  # e.g. after a dead worker, Grain's teardown trips over its pipe
                # Logged, never raised: it would hide the error (or the end) in flight.
                log.log(
                    logging.DEBUG if self.failure else logging.WARNING,
                    "stream %d: closing its pipeline failed",
                    self.stream_id,
                    exc_info=True,
                )
            finally:
                memory.stream_ended()

    def _tick_s(self) -> float:
        """How long to wait for the next item: TICK_S, or until a stuck producer's failure is
        due (UNSTICK_S after the watchdog found it)."""
        if self.failure is None:
            return TICK_S
        return max(0.0, min(TICK_S, self._failed_at + UNSTICK_S - time.monotonic()) + 0.01)

    def _take(self, timeout: float) -> Queued | BaseException | None:
        """The next queued item, the producer's error or StopIteration, or None (a tick)."""
        try:
            return self._producer.get(timeout)
        except queue.Empty:
            return None
        except BaseException as e:  # noqa: BLE001 - StopIteration or the producer's error
            return e

    def __iter__(self) -> Iterator[tuple[pb.Batch | None, BaseException | None]]:
        """Yields (message, None) or, at a failure, (None, error); (None, None) is a tick, so
        the caller can check for cancellation. Ends after the end marker or an error.

        A message is a batch with the batches that follow it, `per_message` in all at most
        (see `coalesce`); the end marker and errors always go alone.
        """
        pending = None  # taken while coalescing, but not joined
        while True:
            item, pending = (
                (pending, None) if pending is not None else (self._take(self._tick_s()), None)
            )
            if isinstance(item, StopIteration):
                return
            if isinstance(item, BaseException):
                yield None, item
                return
            if item is None:
                if self.failure is not None and time.monotonic() - self._failed_at > UNSTICK_S:
                    yield None, self.failure  # the producer is still stuck in Grain
                    return
                yield None, None
                continue
            msg, arrays = item
            if arrays is None:  # the end marker
                yield msg, None
                return
            msg, pending = self._coalesce(item)
            yield msg, None

    def _coalesce(self, item: Queued) -> tuple[pb.Batch, Queued | BaseException | None]:
        """`coalesce`, its time making the message counted as "encode" (waiting for company
        apart)."""
        waited = 0.0

        def take(timeout: float) -> Queued | BaseException | None:
            nonlocal waited
            started = time.perf_counter()
            try:
                return self._take(timeout)
            finally:
                waited += time.perf_counter() - started

        started = time.perf_counter()
        msg, pending = coalesce(item, take, limit=self.per_message)
        self.stream.meter.add("encode", time.perf_counter() - started - waited)
        return msg, pending

    def queued(self) -> int:
        """Batches in the send queue now."""
        return self._producer.queued()

    def stop(self) -> None:
        self._producer.stop()

    def join(self, timeout: float | None = None) -> None:
        self._producer.join(timeout)

    def is_alive(self) -> bool:
        """Whether the producer thread still runs."""
        return self._producer.is_alive()
