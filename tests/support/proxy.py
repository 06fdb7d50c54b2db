"""A recording proxy in front of a real server: what a server receives from a client (its
credit reports) seen on the way, and a far or busy server stood in for by a delay."""

from __future__ import annotations

import itertools
import threading
import time

import grpc

from input_client.proto import pb_grpc
from input_client.wire import MESSAGE_OPTIONS


class RecordingProxy(pb_grpc.InputServiceServicer):
    """Passes every call to the real server, keeping the later requests of each stream (its
    credit reports) in `reports`; with `delay_s`, each batch waits that long on its way to
    the client, so a loop faster than that waits for it."""

    def __init__(self, upstream: str, delay_s: float = 0.0):
        self._channel = grpc.insecure_channel(upstream, options=MESSAGE_OPTIONS)
        self._stub = pb_grpc.InputServiceStub(self._channel)
        self._delay_s = delay_s
        self.reports: list = []
        self._lock = threading.Lock()

    def GetInfo(self, request, context):
        return self._stub.GetInfo(request)

    def _recorded(self, requests):
        for r in requests:
            with self._lock:
                self.reports.append(r)
            yield r

    def StreamBatches(self, requests, context):
        first = next(requests)
        call = self._stub.StreamBatches(itertools.chain([first], self._recorded(requests)))
        try:
            for message in call:
                # Per batch: a message carries as many batches as were ready.
                time.sleep(self._delay_s * (1 + len(message.following)))
                yield message
        except grpc.RpcError as e:
            if context.is_active():
                context.abort(e.code(), e.details())
        finally:
            call.cancel()

    def report_of(self, taken: int, timeout_s: float = 10.0):
        """The report that says `taken` batches were taken, once it arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                for r in self.reports:
                    if r.batches_taken == taken:
                        return r
            time.sleep(0.01)
        raise AssertionError(f"no report of {taken} batches taken: {self.reports[-3:]}")

    def close(self) -> None:
        self._channel.close()
