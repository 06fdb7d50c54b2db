"""The trainer's exposed data wait reaches the server: every credit report carries the seconds
the loop has waited for that stream's batches (`data_wait_s`), one server or fanned in. What a
server receives is seen through a recording proxy in front of a real server (a stand-in for the
network between them, which can also slow the server down as a far or busy one would)."""

from __future__ import annotations

import time

import grpc
import pytest

from input_client import InputClient
from input_client.proto import pb_grpc
from input_client.wire import MESSAGE_OPTIONS
from input_server.serving.server import Server, ServerConfig
from tests.support import serve_servicer
from tests.support.proxy import RecordingProxy


@pytest.fixture
def proxies(tmp_path):
    """`proxies(*delays)`: the targets and proxies of one real server per delay."""
    stack = []

    def start(*delays: float) -> tuple[list[str], list[RecordingProxy]]:
        targets, made = [], []
        for j, delay in enumerate(delays):
            srv = Server(ServerConfig(listen=[f"unix://{tmp_path}/s{j}.sock"]))
            proxy = RecordingProxy(srv.targets[0], delay)
            target = f"unix://{tmp_path}/p{j}.sock"
            serving = serve_servicer(proxy, target)
            serving.__enter__()
            stack.append((srv, proxy, serving))
            targets.append(target)
            made.append(proxy)
        return targets, made

    yield start
    for srv, proxy, serving in reversed(stack):
        serving.__exit__(None, None, None)
        proxy.close()
        srv.stop(0)


def _assert_reports(proxy: RecordingProxy, taken: int, wait_s: float) -> list[float]:
    """The reports' waits: monotone, never negative, the last one `wait_s` exactly."""
    last = proxy.report_of(taken)
    waits = [r.data_wait_s for r in proxy.reports if r.batches_taken <= taken]
    assert all(w >= 0 for w in waits), waits
    assert waits == sorted(waits), waits
    assert last.data_wait_s == wait_s  # the very figure the iterator counted
    return waits


def test_a_loop_faster_than_its_server_reports_its_wait(proxies, make_spec):
    [target], [proxy] = proxies(0.05)
    with InputClient(target) as client, client.batches(make_spec(), prefetch=1) as it:
        for _ in range(20):
            next(it)
        waits = _assert_reports(proxy, 20, it.wait_time_s)
    # Each batch comes 50 ms apart and the loop does nothing: most of that is its wait.
    assert it.wait_time_s >= 19 * 0.05 * 0.8, it.wait_time_s
    assert waits[-1] > waits[0]  # it grew as the loop went on, not once


def test_a_loop_slower_than_its_server_reports_little_wait(proxies, make_spec):
    [target], [proxy] = proxies(0.0)
    with InputClient(target) as client, client.batches(make_spec(), prefetch=2) as it:
        next(it)  # the pipeline's start-up: a wait, but before the loop's pace shows
        started_s = it.wait_time_s
        for _ in range(15):
            time.sleep(0.05)  # a train step far slower than the server
            next(it)
        _assert_reports(proxy, 16, it.wait_time_s)
    assert it.wait_time_s - started_s < 15 * 0.05 * 0.5, (it.wait_time_s, started_s)


def test_each_server_of_a_fan_in_sees_its_own_consumers_wait(proxies, make_spec):
    targets, (slow, fast) = proxies(0.1, 0.0)
    spec = make_spec(order={"epochs": 0})
    with InputClient(targets) as client, client.batches(spec, prefetch=1) as it:
        for _ in range(16):  # round robin: 8 batches of each
            next(it)
        slow_wait = slow.report_of(8).data_wait_s
        fast_wait = fast.report_of(8).data_wait_s
        total = it.wait_time_s
    # The loop waited for the slow server's batches, hardly for the fast one's.
    assert slow_wait >= 7 * 0.1 * 0.7, (slow_wait, fast_wait)
    assert fast_wait < slow_wait / 3, (slow_wait, fast_wait)
    # Every second the fan-in waited is one server's: theirs add up to it.
    assert slow_wait + fast_wait == pytest.approx(total, rel=0.05, abs=0.02)


def test_arrival_order_waits_add_up_to_the_fan_ins(proxies, make_spec):
    targets, servers = proxies(0.05, 0.05)
    spec = make_spec(order={"epochs": 0})
    with (
        InputClient(targets) as client,
        client.batches(spec, prefetch=1, order="arrival") as it,
    ):
        for _ in range(20):
            next(it)
        subs = it._subs  # what each server was told, and how many it gave
        reported = [
            s.report_of(sub.batches_yielded).data_wait_s
            for s, sub in zip(servers, subs, strict=True)
        ]
        assert reported == [sub.wait_time_s for sub in subs]
        total = it.wait_time_s
    assert all(w > 0 for w in reported), reported
    assert sum(reported) == pytest.approx(total, rel=0.05, abs=0.02)


@pytest.mark.parametrize("wait", [float("nan"), float("inf"), -1.0])
def test_a_report_with_a_wait_that_is_no_duration_ends_its_stream(server, make_spec, wait):
    """A credit report whose `data_wait_s` is not a finite number of seconds >= 0 ends the
    stream with INVALID_ARGUMENT naming the field and the value (the server's figures and
    verdict would be the client's invention)."""
    from input_client.proto import pb
    from input_client.wire import PROTOCOL_VERSION

    first = pb.StreamBatchesRequest(
        spec=make_spec(order={"epochs": 0}).to_proto(),
        protocol_version=PROTOCOL_VERSION,
        window=4,
    )
    reports = [first, pb.StreamBatchesRequest(batches_taken=1, data_wait_s=wait)]
    with grpc.insecure_channel(server.targets[0], options=MESSAGE_OPTIONS) as channel:
        call = pb_grpc.InputServiceStub(channel).StreamBatches(iter(reports), timeout=60)
        with pytest.raises(grpc.RpcError) as e:
            for _ in call:
                pass
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "`data_wait_s`" in e.value.details() and repr(wait) in e.value.details()
