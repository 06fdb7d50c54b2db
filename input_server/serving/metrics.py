"""Prometheus metrics: `input_server_*` read from what GetInfo answers at each scrape, served
by prometheus-client's WSGI app on a registry of the server's own.

The registry is not prometheus-client's global one: Grain registers its own metrics there (and
serves them on port 9431 when ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true), so neither page shows
the other's metrics. Labels are bounded: stage names from `STAGES`, status code names from
`grpc.StatusCode`; anything else a stream reports is dropped, never passed on as a label.

Scrapes are counted per peer (`ScrapeLimit`): a peer past its rate is answered 429 by the
page's loop thread, with nothing rendered, so a flood of scrapes costs the server's
interpreter little of what its streams need.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import grpc
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from input_client.proto import pb
from input_server.serving import listen
from input_server.serving.backoff import peer_key
from input_server.serving.bounded_http import BoundedWSGIServer
from input_server.version import __version__

log = logging.getLogger(__name__)

# The stages a stream accounts (`StageTime` in the proto), in the order of the data flow.
STAGES = (
    "read",
    "decompress",
    "tokenize",
    "wait_workers",
    "pack",
    "queue_full",
    "encode",
    "send",
    "credit_wait",
)
CODES = frozenset(c.name for c in grpc.StatusCode)
# A stream ends CANCELLED only when its client cancelled it (the server's own endings are
# UNAVAILABLE, RESOURCE_EXHAUSTED, ...): a trainer that stops early is no alert.
CANCELLED = grpc.StatusCode.CANCELLED.name
NOT_ERRORS = frozenset({"OK", CANCELLED})
# Grain's own page (grain/_src/core/prometheus_monitoring.py, `SetupTelemetry`): a fixed port,
# every interface, in any process that imports grain with the variable set.
GRAIN_PORT = 9431
GRAIN_SWITCH = "ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY"
# Scrapes per peer (`ScrapeLimit`): a token bucket of SCRAPE_BURST scrapes, refilled at
# SCRAPES_PER_S. Prometheus scrapes a target every few tens of seconds (an HA pair twice as
# often) and a person reloads the page by hand: far within. A script polling for a figure
# gets a few seconds of quick polls before it must slow down, and a page newer than
# PAGE_TTL_S at most however fast it polls. A peer past the rate is flooding: it is answered
# 429 on the loop's thread, with nothing rendered, far cheaper than a page.
SCRAPES_PER_S = 5.0
SCRAPE_BURST = 10
# Peers whose scrapes are counted (a small tuple each); past it the least recently seen is
# forgotten, which gives it a full bucket again: the bound is on memory, not on a peer with
# that many addresses.
SCRAPE_PEERS = 4096
# Answers past a peer's rate are logged at most this often, with their count.
LIMIT_LOG_EVERY_S = 60.0
# A page rendered for a plain GET is answered again for this long (`_KeptPage`): many peers,
# each within its rate, then cost one render a period between them, and each of their
# scrapes only the HTTP exchange (measured: docs/benchmarks.md, "Scrape floods"). A scraper
# sees figures this much older at most, next to an interval of tens of seconds.
PAGE_TTL_S = 1.0
# The page's formats kept at once (text or OpenMetrics, gzip or not); past it the oldest
# goes: an Accept header names a version of its own, so the formats asked for are unbounded.
PAGE_VARIANTS = 4


class ServerCollector(Collector):
    """The server's metrics, read from `info()` (what GetInfo answers) at each scrape.

    Args:
      info: returns the server's `GetInfoResponse`; its `totals` feed the counters, its
        live `streams` the gauges.
    """

    def __init__(self, info: Callable[[], pb.GetInfoResponse]):
        self._info = info

    def collect(self) -> Iterator:
        r = self._info()
        t = r.totals
        yield _counter("batches_sent", "Batches sent on every stream.", t.batches_sent)
        tokens = CounterMetricFamily(
            "input_server_tokens_sent",
            "Tokens sent, by kind: real (data) or padding.",
            labels=["kind"],
        )
        tokens.add_metric(["real"], t.real_tokens)
        tokens.add_metric(["padding"], t.padding_tokens)
        yield tokens
        yield _counter("bytes_sent", "Bytes of the batch messages sent.", t.bytes_sent)
        yield GaugeMetricFamily(
            "input_server_active_streams", "Streams running now.", value=len(r.streams)
        )
        yield _by_label(
            "stage_seconds",
            "Seconds each stage took, summed over streams, threads and worker processes.",
            "stage",
            [(s.stage, s.seconds) for s in t.stages],
            allowed=STAGES,
            seed=STAGES,
        )
        yield _counter(
            "client_exposed_wait_seconds",
            "Seconds the trainers' next() blocked after prefetching, as their clients report.",
            t.client_wait_s,
        )
        yield _parallelism(r.streams)
        yield _by_label(
            "stream_errors",
            "Streams that ended with an error, by status code name: not OK, and not CANCELLED "
            "(a client's own leaving: input_server_streams_cancelled).",
            "code",
            [(code, n) for code, n in t.stream_ends.items() if code not in NOT_ERRORS],
            allowed=CODES,
        )
        yield _counter("streams_opened", "Streams opened.", t.streams_opened)
        yield _counter(
            "streams_cancelled",
            "Streams their client cancelled (a closed iterator, a trainer that stopped or was "
            "killed): a client's own leaving, not an error, so not in input_server_stream_errors.",
            t.stream_ends.get(CANCELLED, 0),
        )
        yield _counter(
            "tokenizer_backend_groups",
            "Groups a fast tokenizer backend encoded (audited or not): the audited share is "
            "tokenizer_audited_groups over this.",
            t.backend_groups,
        )
        yield _counter(
            "tokenizer_audited_groups",
            "Groups a fast tokenizer backend encoded that the reference encoded again.",
            t.audited_groups,
        )
        yield _counter(
            "tokenizer_audit_mismatches",
            "Audited groups whose ids differed from the reference's (the reference's served).",
            t.audit_mismatches,
        )
        yield _counter(
            "tokenizer_backend_failed_groups",
            "Groups a fast tokenizer backend failed on (an error, a panic), which the reference "
            "encoded instead.",
            t.backend_failed_groups,
        )
        info = InfoMetricFamily("input_server_build", "The server's version.")
        info.add_metric([], {"version": __version__})
        yield info


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"input_server_{name}", doc, value=value)


def _by_label(
    name: str, doc: str, label: str, pairs: list[tuple[str, float]], *, allowed, seed=()
) -> CounterMetricFamily:
    """A counter with one sample per allowed label value (repeats summed, others dropped),
    those of `seed` at 0 until they move: a series that exists from the start rates right."""
    sums: dict[str, float] = dict.fromkeys(seed, 0.0)
    for key, value in pairs:
        if key in allowed:
            sums[key] = sums.get(key, 0) + value
    family = CounterMetricFamily(f"input_server_{name}", doc, labels=[label])
    for key, value in sums.items():
        family.add_metric([key], value)
    return family


def _parallelism(streams) -> GaugeMetricFamily:
    """Worker processes and per-document threads over the live streams: a stream in the
    server's process (0 processes) runs its threads there; each process runs its own."""
    family = GaugeMetricFamily(
        "input_server_parallelism",
        "Worker processes, and threads doing per-document work, over the live streams.",
        labels=["kind"],
    )
    processes = sum(s.worker_processes for s in streams)
    threads = sum(max(1, s.worker_processes) * s.worker_threads for s in streams)
    family.add_metric(["processes"], processes)
    family.add_metric(["threads"], threads)
    return family


def scrape_key(address: tuple) -> str:
    """Whose bucket a connection from `address` (a socket's peer address) draws on: the rule
    wrong tokens are counted by (`backoff.peer_key`: an IPv4 host, an IPv6 host by its /64),
    an IPv4 peer of a dual-stack socket (::ffff:a.b.c.d) by its IPv4 address, not as one /64
    with every other IPv4 peer."""
    host, port = address[0], address[1]
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return str(host)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return peer_key(f"ipv4:{ip}:{port}" if ip.version == 4 else f"ipv6:[{ip}]:{port}")


class ScrapeLimit:
    """Scrapes by peer, a token bucket each: `burst` scrapes, refilled at `per_s` a second.

    At most `peers` are remembered, the least recently seen forgotten first (a forgotten peer
    starts with a full bucket). A refused scrape takes no token: a peer that keeps flooding
    is answered as soon as it is back within its rate, and never waits longer.
    """

    def __init__(
        self,
        *,
        per_s: float = SCRAPES_PER_S,
        burst: int = SCRAPE_BURST,
        peers: int = SCRAPE_PEERS,
    ):
        if per_s <= 0 or burst < 1 or peers < 1:
            raise ValueError(
                f"ScrapeLimit needs per_s > 0, burst >= 1 and peers >= 1, got per_s={per_s}, "
                f"burst={burst}, peers={peers}."
            )
        self.per_s, self.burst, self.peers = per_s, burst, peers
        self._lock = threading.Lock()
        # key: (tokens, when they were counted); least recently seen first
        self._seen: dict[str, tuple[float, float]] = {}

    def admit(self, key: str, requests: int = 1) -> float | None:
        """Counts `requests` of peer `key` (pipelined on one connection, of which the first is
        answered): None when it may be answered, else the seconds until it could be."""
        now = time.monotonic()
        with self._lock:
            tokens, then = self._seen.pop(key, (float(self.burst), now))
            tokens = min(self.burst, tokens + (now - then) * self.per_s)
            if len(self._seen) >= self.peers:
                self._seen.pop(next(iter(self._seen)))
            if tokens < 1:
                self._seen[key] = (tokens, now)
                return (1 - tokens) / self.per_s
            self._seen[key] = (max(0.0, tokens - requests), now)
            return None

    def __len__(self) -> int:
        return len(self._seen)


def too_many(retry_s: float) -> bytes:
    """A whole HTTP 429 response saying when to come back (Retry-After takes whole seconds;
    rounded up, so a scraper that obeys it finds a token)."""
    after = max(1, math.ceil(retry_s))
    body = f"Too many scrapes from this address; retry after {after} s.\n".encode()
    head = (
        "HTTP/1.0 429 Too Many Requests\r\n"
        f"Retry-After: {after}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class _KeptPage:
    """prometheus-client's page `app`, its answer to a plain GET (no query, no favicon) kept
    `ttl_s` per format and answered again meanwhile; anything else goes to `app` each time.
    The lock makes a second worker wait for the page the first is rendering."""

    def __init__(self, app, *, ttl_s: float = PAGE_TTL_S, variants: int = PAGE_VARIANTS):
        self._app, self._ttl_s, self._variants = app, ttl_s, variants
        self._lock = threading.Lock()
        self._kept: dict[tuple, tuple[float, str, list, bytes]] = {}

    def __call__(self, environ, start_response):
        key = _page_format(environ) if self._ttl_s > 0 else None
        if key is None:
            return self._app(environ, start_response)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or time.monotonic() - kept[0] >= self._ttl_s:
                kept = self._render(environ)
                self._kept.pop(key, None)
                if len(self._kept) >= self._variants:
                    self._kept.pop(next(iter(self._kept)))
                self._kept[key] = kept
        _, status, headers, body = kept
        start_response(status, list(headers))
        return [body]

    def _render(self, environ) -> tuple[float, str, list, bytes]:
        """The app's answer, timed from before its figures were read."""
        at, answer = time.monotonic(), []
        body = b"".join(self._app(environ, lambda *a: answer.append(a[:2])))
        status, headers = answer[0]
        return at, status, headers, body


def _page_format(environ) -> tuple[str, bool] | None:
    """What a plain GET's page depends on (its content type and compression), or None for a
    request answered otherwise (other methods, the favicon, a query such as `name[]`)."""
    if (
        environ.get("REQUEST_METHOD") != "GET"
        or environ.get("QUERY_STRING")
        or environ.get("PATH_INFO") == "/favicon.ico"
    ):
        return None
    _, content_type = choose_encoder(environ.get("HTTP_ACCEPT"))
    return content_type, gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING"))


class MetricsEndpoint:
    """The metrics page at http://HOST:PORT/ (any path): bound at construction, served by a
    named daemon thread from `start()` until `stop()`, within `bounded_http`'s bounds (32
    connections, 2 s of silence, 5 s for a request, 3 threads in all), each peer's scrapes
    within `limit` (past it a 429, nothing rendered).

    Args:
      info: returns the server's `GetInfoResponse`, called once for each page rendered.
      host, port: where to listen (port 0: any free port, then in `.port`).
      limit: the scrapes each peer may make (default: `ScrapeLimit()`, the constants above).
      page_ttl_s: how long a rendered page is answered again (0: rendered for each scrape).

    Raises:
      OSError: one line naming the flag: the port is in use, or Grain's would be.
    """

    def __init__(
        self,
        info: Callable[[], pb.GetInfoResponse],
        *,
        host: str,
        port: int,
        limit: ScrapeLimit | None = None,
        page_ttl_s: float = PAGE_TTL_S,
    ):
        if port == GRAIN_PORT and os.environ.get(GRAIN_SWITCH, "").lower() == "true":
            raise OSError(
                f"--metrics-port {port}: Grain serves its own metrics there ({GRAIN_SWITCH}"
                f"=true); choose another port."
            )
        refused = listen.tcp_refused()
        if refused:
            raise OSError(
                f"--metrics-port {port}: {refused}, and the metrics page is served over TCP "
                f"only; leave out --metrics-port and read the same figures with `input-server "
                f"info` or `input-server stats` over the Unix socket."
            )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServerCollector(info))
        self.limit = ScrapeLimit() if limit is None else limit
        self.limited = 0  # scrapes answered 429
        self._logged_at, self._logged = -LIMIT_LOG_EVERY_S, 0
        bare = host.strip("[]")
        try:
            self._httpd = BoundedWSGIServer(
                (bare, port),
                family=socket.AF_INET6 if ":" in bare else socket.AF_INET,
                gate=self._gate,
            )
        except OSError as e:
            raise OSError(
                f"--metrics-port {port}: cannot bind {host}:{port} ({e.strerror or e}); "
                f"choose another port or stop what holds it."
            ) from None
        self._httpd.set_app(_KeptPage(make_wsgi_app(self.registry), ttl_s=page_ttl_s))
        self.host, self.port = host, self._httpd.server_address[1]
        self._thread: threading.Thread | None = None

    def _gate(self, address: tuple, requests: int) -> bytes | None:
        """On the page's loop thread, before anything is rendered: None to serve the scrape,
        or the 429 that answers it."""
        wait_s = self.limit.admit(scrape_key(address), requests)
        if wait_s is None:
            return None
        self.limited += 1
        self._logged += 1
        now = time.monotonic()
        if now - self._logged_at >= LIMIT_LOG_EVERY_S:
            log.warning(
                "metrics page: %d scrapes answered 429, their peer past %g a second (burst "
                "%d); the last from %s",
                self._logged,
                self.limit.per_s,
                self.limit.burst,
                address[0],
            )
            self._logged_at, self._logged = now, 0
        return too_many(wait_s)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    def stop(self) -> None:
        """Stops serving and releases the port; safe to call twice, or before `start`."""
        if self._thread is not None:
            self._httpd.shutdown()  # waits for serve_forever to return
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
