"""Prometheus metrics: `input_server_*` read from what GetInfo answers at each scrape, served
by prometheus-client's WSGI app on a registry of the server's own.

The registry is not prometheus-client's global one: Grain registers its own metrics there (and
serves them on port 9431 when ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true), so neither page shows
the other's metrics. Labels are bounded: stage names from `STAGES`, status code names from
`grpc.StatusCode`; anything else a stream reports is dropped, never passed on as a label.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator

import grpc
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from input_client.proto import pb
from input_server.serving import listen
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


class MetricsEndpoint:
    """The metrics page at http://HOST:PORT/ (any path): bound at construction, served by a
    named daemon thread from `start()` until `stop()`, within `bounded_http`'s bounds (32
    connections, 2 s of silence, 5 s for a request, 3 threads in all).

    Raises:
      OSError: one line naming the flag: the port is in use, or Grain's would be.
    """

    def __init__(self, info: Callable[[], pb.GetInfoResponse], *, host: str, port: int):
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
        bare = host.strip("[]")
        try:
            self._httpd = BoundedWSGIServer(
                (bare, port), family=socket.AF_INET6 if ":" in bare else socket.AF_INET
            )
        except OSError as e:
            raise OSError(
                f"--metrics-port {port}: cannot bind {host}:{port} ({e.strerror or e}); "
                f"choose another port or stop what holds it."
            ) from None
        self._httpd.set_app(make_wsgi_app(self.registry))
        self.host, self.port = host, self._httpd.server_address[1]
        self._thread: threading.Thread | None = None

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
