"""The prefetching batch iterator: a background thread reads the stream and reconnects."""

from __future__ import annotations

import atexit
import logging
import os
import queue
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from input_client._reconnect import Outage, SetUpWait, check_protocol
from input_client._server_checks import (
    BadBatch,
    Expected,
    check_message,
    checked_state,
    decode_checked,
)
from input_client._slow_start import what_the_server_does
from input_client.credit import Taken
from input_client.errors import InputClientError, SequenceError, StreamError, stream_error
from input_client.proto import pb
from input_client.quiet import Quiet
from input_client.threads import Prefetcher
from input_client.tls_diagnosis import wait_diagnosing
from input_client.wire import CLIENT_KEY, Buffers, batches_of, decode_state, encode_state

log = logging.getLogger(__name__)

# A first batch slower than this gets one log line saying what the server is doing.
FIRST_BATCH_NOTICE_S = 2.0
# Decoded batches' buffers kept for reuse (`wire.Buffers`): at most this many bytes of them.
BUFFERS_BYTES = 256 << 20

_END = object()
# This process's name among a server's clients (`wire.CLIENT_KEY`): its streams share one
# fair share of the server's set-up queue, whatever number of threads or channels opens them.
CLIENT_ID = secrets.token_hex(8)

# Iterators not closed yet, closed when the program exits (atexit runs while gRPC's daemon
# threads still run): one left open to the interpreter's final collection could hang the exit
# (`BatchIterator.close`).
_OPEN: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_iterators() -> None:
    for it in list(_OPEN):
        try:
            it.close()
        except Exception:  # noqa: BLE001 - the others are still closed
            log.warning("input stream: closing an iterator left open at exit failed", exc_info=True)


# A forked child's copy of the parent's iterators is not its own to cancel when it exits.
os.register_at_fork(after_in_child=_OPEN.clear)


class BatchIterator:
    """Yields batches (dicts of arrays) while a background thread fetches the next ones.

    A stream refused at its start because the server's set-up queue is full (it is reading
    other clients' resumed states) is opened again, backing off, for up to `start_deadline_s`
    (`_reconnect.SetUpWait`, said once on stderr); no other refusal is retried at the start.

    The fetch thread also reconnects: a stream that breaks for a retryable reason
    (`_reconnect.RETRYABLE`, or a stream that ends without its end-of-data marker) is reopened
    from the state of the last batch it received, after a backoff, until `reconnect_deadline_s`
    has passed. Batches received before the break stay in the queue and are yielded as usual:
    each carries its sequence number, and the caller's checks see one unbroken sequence.

    Attributes:
      wait_time_s: total seconds the caller spent blocked in `next()` (data-wait time); each
        credit report sends it to the server as `data_wait_s`.
      longest_stall_s: the longest single wait in `next()`, e.g. across a server restart (the
        first wait includes the pipeline's start-up).
      reconnects: how many times a broken stream was reopened and delivered again.
      batches_yielded / tokens_yielded: what the caller has received so far.
    """

    def __init__(
        self,
        stub: Any,
        address: str,
        request: pb.StreamBatchesRequest,
        *,
        state: dict[str, Any] | None,
        prefetch: int,
        sharding: Any,
        expected: Expected,
        reconnect_deadline_s: float = 0.0,
        start_deadline_s: float = 0.0,
        on_item: Callable[[], None] | None = None,
        diagnose: Callable[[float], str | None] | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        self._stub = stub  # an InputServiceStub on the stream's own channel
        # What every batch is checked against before the loop sees it (a server is not trusted).
        self._expected = expected
        self._on_close = on_close or (lambda: None)  # closes the stream's channel
        # Why the server cannot be reached when a TLS handshake tells (`tls_diagnosis.diagnose`): a
        # server restarted with another certificate would otherwise look merely gone.
        self._diagnose = diagnose or (lambda timeout_s: None)
        self._address = address
        self._request = request
        self._sharding = sharding
        self._reconnect_deadline_s = reconnect_deadline_s
        self._start_deadline_s = start_deadline_s
        self._set_up_wait: SetUpWait | None = None  # while the set-up queue keeps it out
        self._started = False  # a message came: a refusal now is no start's
        self._state = dict(state) if state else None
        # The state the fetch thread resumes from: that of the last batch it received.
        self._resume = encode_state(state) if state else b""
        if len(self._resume) > expected.state_bytes:  # what a server of this spec never wrote
            raise ValueError(
                f"`state` is {len(self._resume)} bytes as JSON; a state of this spec is at "
                f"most {expected.state_bytes}: not a get_state() result of this stream."
            )
        self._expected_seq = int(state.get("seq", 0)) if state else 0
        self._outage: Outage | None = None  # while reconnecting
        self._stop = threading.Event()
        self._lock = threading.Lock()  # orders close() against the fetch thread's new calls
        self._prefetch = prefetch
        # The batches held at once: the queue, the loop's and the one before it (a loop may
        # keep it while it dispatches), the one being decoded.
        per_batch = 24 * expected.size * expected.seq_len  # six int32 arrays
        self._buffers = Buffers(keep=min(prefetch + 3, BUFFERS_BYTES // per_batch))
        self._taken: dict[int, Taken] = {}  # by id() of the call whose batches they count
        self._quiet = Quiet()  # the loop's dispatch window, kept free of this client's work
        self._call: Any = self._open()
        self._done = False
        self.wait_time_s = 0.0
        self.longest_stall_s = 0.0
        self.reconnects = 0
        self.batches_yielded = 0
        self._noticed = False  # the slow-first-batch line was logged
        self.tokens_yielded = 0
        self._fetcher = Prefetcher(
            self._fetch, depth=prefetch, name="input-client-fetch", on_put=on_item
        )
        _OPEN.add(self)

    def _open(self) -> Any:
        request = pb.StreamBatchesRequest()
        request.CopyFrom(self._request)
        request.resume_state = self._resume
        # The batches this client holds untaken: its prefetch queue and the one in hand.
        request.window = self._prefetch + 1
        taken = Taken(hold=self._hold)
        call = self._stub.StreamBatches(
            taken.requests(request), metadata=((CLIENT_KEY, CLIENT_ID),)
        )
        self._taken[id(call)] = taken
        return call

    def _track(self, call: Any) -> bool:
        """Makes `call` the one `close()` cancels; False (and cancelled) if closed already."""
        with self._lock:
            if self._stop.is_set():
                call.cancel()
                taken = self._taken.pop(id(call), None)  # a stream's credit ends with it
                if taken is not None:
                    taken.end()
                return False
            self._call = call
            return True

    def _hold(self) -> None:
        """Keeps this background thread off the GIL while the loop dispatches (`quiet`)."""
        self._quiet.hold(self._loop_has_a_batch)

    def _loop_has_a_batch(self) -> bool:
        # Asked only once the loop took a batch: a server's first batch can reach the fetch
        # thread before the constructor has set `_fetcher` (`self._fetcher.ready` there raised).
        return self._fetcher.ready()

    def _place(self, arrays: dict[str, Any]) -> dict[str, Any]:
        if self._sharding is None:
            return arrays
        import jax  # lazily: a client that wants numpy never loads jax

        if self._sharding.is_fully_addressable:
            # This process holds the whole batch: one transfer of the six arrays, half the
            # fetch thread's time (and GIL) of six calls of the general form below.
            return jax.device_put(arrays, self._sharding)
        return {
            k: jax.make_array_from_process_local_data(self._sharding, v) for k, v in arrays.items()
        }

    def _pump(self, call: Any, put: Callable[[tuple], bool]) -> StreamError | None:
        """Moves one stream's batches into the queue; returns the failure that ended it, if any.

        Raises whatever decoding or placement raises.
        """
        taken = self._taken.get(id(call))
        try:
            for message in call:
                self._started = True
                if self._outage is not None:
                    seq = decode_state(self._resume).get("seq", 0) if self._resume else 0
                    self._outage.ended(seq)
                    self.reconnects += 1
                    self._outage = None
                self._check(check_message, message)
                for msg in batches_of(message):
                    if msg.end_of_data:
                        put((_END, msg.sequence_number, None, 0, None))
                        return None
                    self._hold()
                    arrays = self._check(decode_checked, msg, self._expected, self._buffers)
                    state = self._check(checked_state, msg, self._expected)
                    if not put(
                        (self._place(arrays), msg.sequence_number, state, msg.num_tokens, taken)
                    ):
                        return None
                    self._resume = msg.state
        except grpc.RpcError as e:
            if self._stop.is_set():
                return None
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in str(
                e.details()
            ):  # this client's receive limit, not the server's caps: no retry can cure it
                raise StreamError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the server at {self._address!r} sent a message over this client's "
                    f"receive limit of {self._expected.receive_limit} bytes ({e.details()}); "
                    f"a batch of {self._expected.shape()} and its state need far less: refused "
                    f"before reading it. A faulty server, or not an input server of this "
                    f"release.",
                ) from None
            return stream_error(e.code(), e.details())
        finally:
            if taken is not None:
                taken.end()
            self._taken.pop(id(call), None)
        if self._stop.is_set():
            return None
        # A stream that stops without its end-of-data marker lost something (a proxy or a
        # transport that closed the stream cleanly): treated like a dropped connection.
        return StreamError(
            grpc.StatusCode.UNAVAILABLE, "the stream ended without its end-of-data marker."
        )

    def _check(self, check: Callable[..., Any], msg: Any, *args: Any) -> Any:
        """`check(msg, *args)`, its `BadBatch` as a `StreamError` (DATA_LOSS) naming the server:
        data no retry from the same server can cure."""
        try:
            return check(msg, *args)
        except BadBatch as e:
            which = f"batch {msg.sequence_number}" if msg.tensors else "a message"
            raise StreamError(
                grpc.StatusCode.DATA_LOSS,
                f"the server at {self._address!r} sent {which} that does not fit this "
                f"stream's spec (batches of {self._expected.shape()}): {e}. Refused before the "
                f"training loop saw it: a faulty server, or not an input server of this "
                f"release.",
            ) from None

    def _fetch(self, put: Callable[[tuple], bool]) -> None:
        """The fetch thread: streams, and reopens broken streams; raises when it gives up
        (`StreamError`, `ReconnectError`) or decoding or placement fails."""
        call = self._call
        while call is not None:
            error = self._pump(call, put)
            if error is None:
                return
            call = self._reopen(error)

    def _reopen(self, error: StreamError) -> Any:
        """Waits, backing off, until a new stream from the last state is open; None if closed.

        Raises:
          StreamError: `error`, if it is not retryable or reconnecting is off; or
            FAILED_PRECONDITION, the server is back but speaks another wire protocol.
          ReconnectError: the deadline passed.
        """
        reconnecting = self._outage is not None
        starting = not (reconnecting or self._started) and self._start_deadline_s > 0
        if starting and SetUpWait.applies(error):
            return self._wait_for_set_up(error)
        if (
            not Outage.retryable(error, reconnecting=reconnecting)
            or self._reconnect_deadline_s <= 0
        ):
            raise error
        if not reconnecting:
            self._outage = Outage(self._address, self._reconnect_deadline_s, error)
        outage = self._outage
        while True:
            outage.error = error
            if self._stop.wait(outage.next_pause_s()):
                return None
            outage.attempts += 1
            # Wait for the server to be reachable again, up to the deadline (gRPC redials it
            # within RECONNECT_OPTIONS' backoff); the future lets close() cancel the wait.
            wait_s = max(outage.remaining_s(), 0.001)
            probe = self._stub.GetInfo.future(
                pb.GetInfoRequest(), timeout=wait_s, wait_for_ready=True
            )
            if not self._track(probe):
                return None
            try:
                # A server replaced during the outage may be of another release.
                check_protocol(wait_diagnosing(probe, self._diagnose, wait_s), self._address)
            except ConnectionError as e:  # a TLS mistake: the outage's error, said once
                if str(e) != outage.error.details:
                    log.warning("input stream to %s: %s", self._address, e)
                error = StreamError(grpc.StatusCode.UNAVAILABLE, str(e))
                continue
            except grpc.FutureCancelledError:
                return None
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return None
                if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    error = StreamError(e.code(), e.details())
                continue
            call = self._open()
            if not self._track(call):
                return None
            return call

    def _wait_for_set_up(self, error: StreamError) -> Any:
        """Opens the stream again after a pause while the server's set-up queue refuses it;
        None if closed.

        Raises:
          StreamError: the refusal, once `start_deadline_s` has passed since the first.
        """
        if self._set_up_wait is None:
            self._set_up_wait = SetUpWait(self._address, self._start_deadline_s, error)
        wait = self._set_up_wait
        wait.error = error
        if self._stop.wait(wait.next_pause_s()):
            return None
        call = self._open()
        return call if self._track(call) else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        try:
            return self.take()
        except InputClientError as e:
            # Raised on the fetch thread (or in its reconnect loop): those frames say nothing
            # to the loop, whose traceback is then its own line and this one. The error's
            # words carry the server's status; a cause it was given on purpose stays.
            raise e.with_traceback(None) from e.__cause__

    def take(self, waited_s: float = 0.0) -> dict[str, Any]:
        """`next()`; `waited_s`: seconds the caller already waited for this batch elsewhere (a
        fan-in choosing among servers), counted as this stream's wait: it is the loop's."""
        if self._done:
            raise StopIteration
        start = time.perf_counter() - waited_s
        try:
            arrays, seq, state, num_tokens, taken = self._next_item()
        except StopIteration:
            self._done = True
            raise StreamError(grpc.StatusCode.CANCELLED, "the iterator was closed.") from None
        except InputClientError as e:  # the stream's failure, raised on the fetch thread
            self.close()
            # Its frames there (the reconnect machinery) say nothing to the loop: a fan-in's
            # `next()` re-raises it too, and shows its caller this frame on, no deeper.
            raise e.with_traceback(None) from e.__cause__
        except Exception:  # a KeyboardInterrupt leaves the stream open
            self.close()
            raise
        finally:
            waited = time.perf_counter() - start
            self.wait_time_s += waited
            self.longest_stall_s = max(self.longest_stall_s, waited)
        if seq != self._expected_seq:
            self.close()
            raise SequenceError(
                f"expected batch {self._expected_seq}, got batch {seq}: "
                f"{'a gap' if seq > self._expected_seq else 'a repeat'}."
            )
        if arrays is _END:
            self.close()
            raise StopIteration
        if taken is not None:
            # The server may send one more; the wait, counted above, goes with the report.
            taken.took(self.wait_time_s)
        self._quiet.taken()
        self._expected_seq += 1
        self._state = state
        self.batches_yielded += 1
        self.tokens_yielded += num_tokens
        return arrays

    def _next_item(self) -> tuple:
        """The fetch thread's next item; the first batch, if slow, says once why."""
        if self.batches_yielded or self._noticed:
            return self._fetcher.get()
        try:
            return self._fetcher.get(FIRST_BATCH_NOTICE_S)
        except queue.Empty:
            self._noticed = True
            log.warning(
                "input_client: no first batch after %.0f s; %s",
                FIRST_BATCH_NOTICE_S,
                what_the_server_does(self._stub),
            )
            return self._fetcher.get()

    def ready(self) -> bool:
        """Whether `next()` would return (or raise) without waiting: a batch, the end or the
        stream's failure has arrived. `on_item` is called whenever this may have become true."""
        return self._done or self._fetcher.ready()

    def get_state(self) -> dict[str, Any] | None:
        """The state after the last batch yielded (not received): pass it as `state=` to resume.

        JSON-serializable; None before the first batch of a fresh stream.
        """
        return dict(self._state) if self._state is not None else None

    def close(self) -> None:
        """Cancels the stream (the server tears its pipeline down) and stops the fetch thread."""
        self._done = True
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            # Dropped as well as cancelled: a call left for the garbage collector (this
            # iterator is in a cycle with its fetch thread's producer) may be finalized by the
            # interpreter's last collection at exit, whose `__del__` waits for the call's lock
            # that a gRPC daemon thread frozen by the exit can hold: the process hung at exit.
            call, self._call = self._call, None
            call.cancel()
            # Its credit ends with it: a fetch thread that had not yet read the call never
            # pumps it, and gRPC's request thread would wait in `Taken.requests` for good.
            taken = self._taken.pop(id(call), None)
            if taken is not None:
                taken.end()
        self._fetcher.close(timeout=10)  # also frees prefetched batches now
        self._on_close()
        _OPEN.discard(self)

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # Cancel the call of an iterator dropped without close(), so the server tears down.
        stop, call = getattr(self, "_stop", None), getattr(self, "_call", None)
        if stop is not None and call is not None and not stop.is_set():
            stop.set()
            call.cancel()
            fetcher = getattr(self, "_fetcher", None)
            if fetcher is not None:
                fetcher.stop()
