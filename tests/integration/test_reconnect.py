"""The client's reconnect against in-process servers: a drained server replaced on its socket,
a proxy that ends streams early or meets a full server, a server gone for good. Every wait is
bounded; the batches must be exactly those of an uninterrupted run."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import grpc
import pytest

from input_client import InputClient, ReconnectError
from input_client.proto import pb_grpc
from input_client.wire import MESSAGE_OPTIONS
from input_server.serving.server import Server, ServerConfig
from tests.support import assert_same_batches, run_pipeline, serve_servicer


def test_drained_server_replaced_on_the_same_socket_continues_exactly(tmp_path, make_spec):
    spec = make_spec(batch={"seq_len": 1024, "size": 8}, order={"epochs": 0})
    config = ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], grace_s=1)
    first = Server(config)
    servers: list[Server] = []
    replacement = threading.Timer(0.5, lambda: servers.append(Server(config)))
    got = []
    try:
        with (
            InputClient(first.targets[0]) as client,
            client.batches(spec, reconnect_deadline_s=30) as it,
        ):
            got += [next(it) for _ in range(10)]
            first.stop()  # SIGTERM's path: streams end with UNAVAILABLE, the socket goes
            replacement.start()
            while it.reconnects == 0:  # what had arrived before the drain comes first
                got.append(next(it))
                assert len(got) < 5000, "the drain never broke the stream"
            got += [next(it) for _ in range(10)]
    finally:
        replacement.join()
        for srv in servers:
            srv.stop(0)
    assert_same_batches(got, run_pipeline(spec, limit=len(got)))


def test_server_gone_for_good_raises_after_the_deadline_not_a_hang(tmp_path, make_spec):
    srv = Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], grace_s=1))
    with (
        InputClient(srv.targets[0]) as client,
        client.batches(make_spec(order={"epochs": 0}), prefetch=1, reconnect_deadline_s=1.5) as it,
    ):
        next(it)
        next(it)
        start = time.monotonic()
        srv.stop()
        with pytest.raises(ReconnectError) as e:
            for _ in range(10_000):
                next(it)
        assert time.monotonic() - start < 10
        assert it.get_state()["seq"] == it.batches_yielded  # still the last batch yielded
    assert e.value.waited_s >= 1.5
    assert e.value.code == grpc.StatusCode.UNAVAILABLE  # a StreamError with the last status
    assert f"unix://{tmp_path}/s.sock" in str(e.value)
    assert "reconnect_deadline_s=1.5" in str(e.value)


class _CuttingProxy(pb_grpc.InputServiceServicer):
    """A gRPC proxy in front of the real server (what a load balancer or sidecar proxy is): it
    ends its first stream cleanly after `cut_after` messages, without the end marker, as a
    proxy closing streams would. With `hog_s`, it first takes the server's only stream slot
    for that long (another trainer's stream, say), so the client's reconnects meet
    RESOURCE_EXHAUSTED, which the proxy passes on, counted in `refused`."""

    def __init__(self, upstream: str, cut_after: int, hog_s: float = 0.0):
        self._channel = grpc.insecure_channel(upstream, options=MESSAGE_OPTIONS)
        self._stub = pb_grpc.InputServiceStub(self._channel)
        self._cut_after, self._hog_s = cut_after, hog_s
        self._release: threading.Timer | None = None
        self.streams = self.refused = 0

    def GetInfo(self, request, context):
        return self._stub.GetInfo(request)

    def StreamBatches(self, requests, context):
        self.streams += 1
        first = self.streams == 1
        request = next(requests)
        # The client's later requests (its credit) pass through too.
        call = self._stub.StreamBatches(itertools.chain([request], requests))
        try:
            for i, message in enumerate(call):
                if first and i == self._cut_after:
                    call.cancel()
                    if self._hog_s:
                        self._hog(request)
                    return  # a clean end: OK status, no end-of-data marker
                yield message
        except grpc.RpcError as e:
            self.refused += e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            context.abort(e.code(), e.details())
        finally:
            call.cancel()

    def _hog(self, request) -> None:
        """Takes the slot the cut stream frees (once the server has let it go), for hog_s."""
        deadline = time.monotonic() + 10
        while True:
            hog = self._stub.StreamBatches(iter([request]))
            try:
                next(hog)
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert time.monotonic() < deadline, "the cut stream's slot was never freed"
                time.sleep(0.02)
        self._release = threading.Timer(self._hog_s, hog.cancel)
        self._release.start()

    def close(self) -> None:
        if self._release is not None:
            self._release.cancel()
            self._release.join()
        self._channel.close()


@pytest.fixture
def proxied(tmp_path):
    """`proxied(cut_after, hog_s)`: the target of a `_CuttingProxy` in front of a real server
    that runs one stream at a time."""
    with contextlib.ExitStack() as stack:

        def start(cut_after: int, hog_s: float = 0.0) -> tuple[str, _CuttingProxy]:
            srv = Server(ServerConfig(listen=[f"unix://{tmp_path}/server.sock"], max_streams=1))
            stack.callback(srv.stop, 0)
            proxy = _CuttingProxy(srv.targets[0], cut_after, hog_s)
            stack.callback(proxy.close)
            target = f"unix://{tmp_path}/proxy.sock"
            stack.enter_context(serve_servicer(proxy, target))
            return target, proxy

        yield start


def test_stream_ended_without_its_end_marker_is_resumed_not_taken_as_the_end(proxied, make_spec):
    spec = make_spec(order={"epochs": 2})
    target, _ = proxied(cut_after=3)
    with InputClient(target) as client, client.batches(spec, reconnect_deadline_s=30) as it:
        got = list(it)
        assert it.reconnects == 1  # (a reopen may meet the cut stream's slot not yet free)
    assert_same_batches(got, run_pipeline(spec))  # the whole stream: nothing lost or repeated


def test_full_server_while_reconnecting_is_retried_until_a_slot_frees(proxied, make_spec):
    # Endless, so the other stream holds its slot (a finite one could finish in the window).
    spec = make_spec(order={"epochs": 0})
    target, proxy = proxied(cut_after=3, hog_s=1.0)
    with InputClient(target) as client, client.batches(spec, reconnect_deadline_s=30) as it:
        got = [next(it) for _ in range(100)]
        assert it.reconnects == 1
        assert it.longest_stall_s >= 0.5  # it waited out the other stream's slot
    assert proxy.refused >= 1  # the reconnect did meet a full server
    assert_same_batches(got, run_pipeline(spec, limit=len(got)))
