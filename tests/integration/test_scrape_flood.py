"""The metrics page under a flood of scrapes (issue 50, finding 6), on real sockets: a peer past
its rate is answered 429 with Retry-After and nothing rendered, while another peer is still
served the page with its figures; pipelined requests count each; many peers within their
rates share one render a period. The page listens on 127.0.0.1, and its peers connect from
addresses of 127.0.0.0/8, which Linux routes to the loopback interface.

Renders are counted by the page's own `info` callable (`MetricsEndpoint`'s API: it is called
once for each page rendered), whose figures also say which call a page came from.
"""

from __future__ import annotations

import contextlib
import errno
import math
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from input_client.proto import pb
from input_server import __version__
from input_server.serving.metrics import (
    PAGE_TTL_S,
    SCRAPE_BURST,
    SCRAPES_PER_S,
    MetricsEndpoint,
    ScrapeLimit,
)

GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: identity\r\n\r\n"


class CountedInfo:
    """What GetInfo would answer, counting its calls: batches_sent is the call's number."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = 0

    def __call__(self) -> pb.GetInfoResponse:
        with self._lock:
            self.calls += 1
            n = self.calls
        totals = pb.ServerTotals(
            batches_sent=n, real_tokens=900, padding_tokens=100, streams_opened=9
        )
        streams = [pb.StreamInfo(stream_id=1, worker_processes=0, worker_threads=3)]
        return pb.GetInfoResponse(server_version=__version__, streams=streams, totals=totals)


@contextlib.contextmanager
def page(info: CountedInfo, **kwargs):
    """A started `MetricsEndpoint` on 127.0.0.1 (any free port): its port."""
    endpoint = MetricsEndpoint(info, host="127.0.0.1", port=0, **kwargs)
    endpoint.start()
    try:
        yield endpoint.port
    finally:
        endpoint.stop()


def get(port: int, source: str, requests: int = 1) -> list[tuple[int, dict, bytes]]:
    """`requests` GETs written at once on one connection from `source`, read until the server
    closes it: each response as (status, headers, body)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            pytest.skip(f"cannot connect from {source}: this host does not route 127.0.0.0/8")
        raise
    with sock:
        sock.sendall(GET * requests)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    responses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        size = int(headers["Content-Length"])
        responses.append((int(lines[0].split()[1]), headers, rest[:size]))
        data = rest[size:]
    return responses


def scrape(port: int, source: str) -> tuple[int, dict, bytes]:
    (response,) = get(port, source)
    return response


def figures(body: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def assert_figures(body: bytes, info: CountedInfo) -> int:
    """The page shows what one of `info`'s calls answered: that call's number."""
    page = figures(body)
    n = page[("input_server_batches_sent_total", ())]
    assert n == int(n) and 1 <= n <= info.calls, (n, info.calls)
    assert page[("input_server_tokens_sent_total", (("kind", "real"),))] == 900
    assert page[("input_server_tokens_sent_total", (("kind", "padding"),))] == 100
    assert page[("input_server_streams_opened_total", ())] == 9
    assert page[("input_server_active_streams", ())] == 1
    assert page[("input_server_parallelism", (("kind", "threads"),))] == 3
    assert page[("input_server_build_info", (("version", __version__),))] == 1
    return int(n)


def assert_too_many(response: tuple[int, dict, bytes]) -> int:
    """A 429 with a Retry-After of whole seconds and no figures: its Retry-After."""
    status, headers, body = response
    assert status == 429, response
    after = headers["Retry-After"]
    assert after.isdigit() and int(after) >= 1, headers
    assert b"input_server" not in body, body
    return int(after)


def test_a_flooding_peer_gets_429s_past_its_burst_while_another_peer_is_served():
    info = CountedInfo()
    with page(info) as port:
        started, answers = time.monotonic(), []
        # Until a few refusals (a slow host refills the bucket between scrapes), or too long.
        while sum(a[0] == 429 for a in answers) < 5 and len(answers) < 20 * SCRAPE_BURST:
            answers.append(scrape(port, "127.0.0.1"))
        elapsed = time.monotonic() - started
        other = scrape(port, "127.0.0.2")
    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] != 200]
    # Its whole burst, and no more than its rate added while it flooded.
    assert SCRAPE_BURST <= len(served) <= SCRAPE_BURST + SCRAPES_PER_S * elapsed + 1, (
        len(served),
        elapsed,
    )
    assert refused, "a flood past the burst was never refused"
    for response in refused:
        assert_too_many(response)
    for _, _, body in served:
        assert_figures(body, info)
    assert other[0] == 200, other
    assert_figures(other[2], info)
    # The 429s rendered nothing: renders are at most the pages served, and far fewer than
    # the requests.
    assert info.calls <= len(served) + 1, (info.calls, len(served))
    assert info.calls < len(answers) / 2, (info.calls, len(answers))


def test_pipelined_requests_on_one_connection_count_each():
    info = CountedInfo()
    # A slow refill: the bucket stays empty through the test however slow the host.
    with page(info, limit=ScrapeLimit(per_s=0.05, burst=4)) as port:
        pipelined = get(port, "127.0.0.3", requests=4)
        after = scrape(port, "127.0.0.3")
        other = scrape(port, "127.0.0.4")
    # One answer a connection (the first request), and all four counted: the bucket is empty.
    assert [r[0] for r in pipelined] == [200], pipelined
    assert_figures(pipelined[0][2], info)
    assert assert_too_many(after) >= 10, after[1]  # a token is 20 s away
    assert other[0] == 200, other


def test_a_peer_that_waits_its_retry_after_is_served_again():
    info = CountedInfo()
    with page(info, limit=ScrapeLimit(per_s=2.0, burst=1)) as port:
        first = scrape(port, "127.0.0.5")
        refused = scrape(port, "127.0.0.5")
        time.sleep(assert_too_many(refused))
        again = scrape(port, "127.0.0.5")
    assert first[0] == 200 and again[0] == 200, (first, again)


def test_many_peers_within_their_rates_share_one_render_a_period():
    info = CountedInfo()
    peers = [f"127.0.1.{i}" for i in range(1, 21)]
    with page(info) as port:
        started = time.monotonic()
        answers = [scrape(port, peer) for peer in peers]
        elapsed = time.monotonic() - started
        renders = info.calls
        time.sleep(PAGE_TTL_S + 0.1)
        later = scrape(port, "127.0.1.21")
    assert [a[0] for a in answers] == [200] * len(peers), [a[0] for a in answers]
    shown = [assert_figures(body, info) for _, _, body in answers]
    assert renders <= 1 + math.ceil(elapsed / PAGE_TTL_S), (renders, elapsed)
    assert len(set(shown)) == renders, shown
    # A page is never older than its period: past it, the next scrape reads the figures anew.
    assert later[0] == 200 and assert_figures(later[2], info) == renders + 1
