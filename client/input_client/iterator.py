"""The client: a gRPC channel to the input server and a prefetching batch iterator."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from input_client._proto.input_server.v1 import input_service_pb2 as pb
from input_client._proto.input_server.v1 import input_service_pb2_grpc as pb_grpc
from input_client.codec import decode_batch, decode_state, encode_state
from input_client.errors import SequenceError, StreamError
from input_client.spec import PipelineSpec

# Batches can be tens of MB; gRPC's default 4 MiB receive limit would refuse them.
MESSAGE_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
_POLL_S = 0.1
_END = object()


class InputClient:
    """A connection to an input server.

    Args:
      address: a gRPC target: `unix:///path/to.sock` (sidecar) or `host:port`.
      connect_timeout_s: how long `batches()` and `info()` wait for the server to be reachable
        before raising, so a missing server is an error, not a hang.
    """

    def __init__(self, address: str, *, connect_timeout_s: float = 30.0):
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self._channel = grpc.insecure_channel(address, options=MESSAGE_OPTIONS)
        self._stub = pb_grpc.InputServiceStub(self._channel)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Blocks until the server is reachable; raises `ConnectionError` after the timeout."""
        timeout_s = self.connect_timeout_s if timeout_s is None else timeout_s
        # A cheap call that waits for the connection (channel_ready_future leaves a polling
        # thread behind that fails once the channel closes).
        try:
            self._stub.GetInfo(pb.GetInfoRequest(), timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ConnectionError(f"no input server reachable at {self.address!r} after "
                                      f"{timeout_s:g} s.") from None
            raise StreamError(e.code(), e.details()) from None

    def info(self) -> pb.GetInfoResponse:
        """Server version, configured pipelines and the streams running now."""
        try:
            return self._stub.GetInfo(pb.GetInfoRequest(), timeout=self.connect_timeout_s,
                                      wait_for_ready=True)
        except grpc.RpcError as e:
            raise StreamError(e.code(), e.details()) from None

    def batches(self, spec: PipelineSpec | str, *, state: dict[str, Any] | None = None,
                prefetch: int = 2, sharding: Any = None) -> BatchIterator:
        """Streams the batches of `spec` (or of the pipeline the server knows by that name).

        Args:
          spec: a `PipelineSpec`, or the name of a pipeline the server was started with.
          state: a `get_state()` result, to continue right after the batch it belongs to.
          prefetch: batches fetched and decoded ahead of the training loop.
          sharding: a `jax.sharding.Sharding`; when given, batches are global `jax.Array`s
            built from this process's data (`jax.make_array_from_process_local_data`).
        """
        if prefetch < 1:
            raise ValueError(f"`prefetch` must be at least 1, got {prefetch}.")
        request = pb.StreamBatchesRequest(resume_state=encode_state(state) if state else b"")
        if isinstance(spec, str):
            request.pipeline_name = spec
        else:
            request.spec.CopyFrom(spec.to_proto())
        self.wait_ready()
        return BatchIterator(self._stub.StreamBatches(request), state=state, prefetch=prefetch,
                             sharding=sharding)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> InputClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BatchIterator:
    """Yields batches (dicts of arrays) while a background thread fetches the next ones.

    Attributes:
      wait_time_s: total seconds the caller spent blocked in `next()` (data-wait time).
      batches_yielded / tokens_yielded: what the caller has received so far.
    """

    def __init__(self, call: Any, *, state: dict[str, Any] | None, prefetch: int,
                 sharding: Any):
        self._call = call
        self._sharding = sharding
        self._state = dict(state) if state else None
        self._expected_seq = int(state.get("seq", 0)) if state else 0
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._done = False
        self.wait_time_s = 0.0
        self.batches_yielded = 0
        self.tokens_yielded = 0
        self._thread = threading.Thread(target=self._fetch, name="input-client-fetch",
                                        daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _place(self, arrays: dict[str, Any]) -> dict[str, Any]:
        if self._sharding is None:
            return arrays
        import jax  # lazily: a client that wants numpy never loads jax

        return {k: jax.make_array_from_process_local_data(self._sharding, v)
                for k, v in arrays.items()}

    def _fetch(self) -> None:
        try:
            for msg in self._call:
                if msg.end_of_data:
                    self._put((_END, msg.sequence_number, None, 0))
                    return
                arrays = self._place(decode_batch(msg.tensors))
                if not self._put((arrays, msg.sequence_number, decode_state(msg.state),
                                  msg.num_tokens)):
                    return
            # A stream that stops without its end-of-data marker lost something.
            self._put((StreamError(grpc.StatusCode.UNAVAILABLE,
                                   "the stream ended without its end-of-data marker."), 0, None, 0))
        except grpc.RpcError as e:
            if not self._stop.is_set():
                self._put((StreamError(e.code(), e.details()), 0, None, 0))
        except Exception as e:  # decoding or placement failed: hand it to the caller
            self._put((e, 0, None, 0))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._done:
            raise StopIteration
        start = time.perf_counter()
        try:
            while True:
                try:
                    arrays, seq, state, num_tokens = self._queue.get(timeout=_POLL_S)
                    break
                except queue.Empty:
                    if not self._thread.is_alive() and self._queue.empty():
                        self._done = True
                        raise StreamError(grpc.StatusCode.CANCELLED,
                                          "the iterator was closed.") from None
        finally:
            self.wait_time_s += time.perf_counter() - start
        if isinstance(arrays, BaseException):
            self.close()
            raise arrays
        if seq != self._expected_seq:
            self.close()
            raise SequenceError(f"expected batch {self._expected_seq}, got batch {seq}: "
                                f"{'a gap' if seq > self._expected_seq else 'a repeat'}.")
        if arrays is _END:
            self.close()
            raise StopIteration
        self._expected_seq += 1
        self._state = state
        self.batches_yielded += 1
        self.tokens_yielded += num_tokens
        return arrays

    def get_state(self) -> dict[str, Any] | None:
        """The state after the last batch yielded (not received): pass it as `state=` to resume.

        JSON-serializable; None before the first batch of a fresh stream.
        """
        return dict(self._state) if self._state is not None else None

    def close(self) -> None:
        """Cancels the stream (the server tears its pipeline down) and stops the fetch thread."""
        self._done = True
        if not self._stop.is_set():
            self._stop.set()
            self._call.cancel()
            self._thread.join(timeout=10)
            while not self._queue.empty():  # free prefetched batches now
                self._queue.get_nowait()

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
