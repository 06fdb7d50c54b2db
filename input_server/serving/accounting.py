"""A stream's accounting as `input-server stats` and the metrics see it: its figures since it
opened (`StreamStats`) and the verdict over its recent window (`verdict.verdict`).

The counts themselves are the stream's meter's (`batching.meter.LiveMeter`: each stage's
seconds, tokens, bytes) and its credit's (the client's reports); this keeps readings of them,
so a verdict reads the last WINDOW_S or so, not the whole stream (a stream input-bound at its
start and fine since is fine).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time

from input_client.proto import pb
from input_server.serving.verdict import MIN_BATCHES, Window, verdict
from input_server.stages import STAGES

log = logging.getLogger("input_server.serving.stream")

# A verdict reads at least WINDOW_S of readings when the stream is that old (at most twice).
WINDOW_S = 30.0
# Readings are taken at most this often (by `info` and by the sender, `tick`).
READ_EVERY_S = 2.0
MAX_READINGS = 300  # 10 minutes of readings


@dataclasses.dataclass(frozen=True)
class Reading:
    at: float  # monotonic seconds
    stages: dict[str, float]
    produced: int
    report: tuple[float, int, float] | None  # the client's latest (time, taken, wait)


class Accounting:
    """Readings of one stream's meter and credit, and the verdict on its recent window.

    Args:
      stream_id: the stream's id (its log lines name it).
      session: its producer (`session.StreamSession`): the meter, batches produced, queue.
      credit: its client's reports (`credit.Credit`).
      max_workers: the most worker processes the stream may use (the verdict says it).
    """

    def __init__(self, stream_id: int, session, credit, *, max_workers: int):
        self.stream_id = stream_id
        self._session = session
        self._credit = credit
        self._max_workers = max_workers
        spec = session.stream.pipeline.spec
        self._tokenizer = (
            (spec.tokenizer.kind or "the tokenizer") if spec.tokenizer.model else ("the ids check")
        )
        self._opened = time.monotonic()
        self._readings = collections.deque([self._read(self._opened)])
        self._lock = threading.Lock()
        self.kind, self.line = "starting", "starting: no batch yet"

    def _read(self, now: float) -> Reading:
        meter = self._session.stream.meter
        return Reading(
            now,
            meter.stage_seconds(),
            self._session.batches_produced,
            self._credit.latest_report(),
        )

    def tick(self) -> None:
        """Takes a reading if the last is READ_EVERY_S old, and logs a change of verdict."""
        now = time.monotonic()
        with self._lock:
            if now - self._readings[-1].at < READ_EVERY_S:
                return
            self._readings.append(self._read(now))
            # The oldest kept is the newest at least WINDOW_S old (or the first) whose window
            # still holds MIN_BATCHES: a slow stream (a step of seconds) gets a longer window,
            # not "starting" for ever; at most MAX_READINGS are kept (a trainer paused long).
            new = self._readings[-1]
            while len(self._readings) > 2 and (
                len(self._readings) > MAX_READINGS
                or (
                    now - self._readings[1].at >= WINDOW_S
                    and new.produced - self._readings[1].produced >= MIN_BATCHES
                )
            ):
                self._readings.popleft()
            window = self._window(self._readings[0], self._readings[-1])
            kind, line = verdict(window)
            changed = kind != self.kind
            self.kind, self.line = kind, line
        if changed and kind != "starting":
            log.info(
                "stream %d: %s",
                self.stream_id,
                line,
                extra={
                    "event": "stream_verdict",
                    "fields": {"stream": self.stream_id, "kind": kind, "verdict": line},
                },
            )

    def _window(self, old: Reading, new: Reading) -> Window:
        seconds = new.at - old.at
        stages = {s: new.stages[s] - old.stages[s] for s in STAGES}
        produced = new.produced - old.produced
        busy = max(0.01 * seconds, seconds - stages["queue_full"], 1e-9)  # a wait lands whole
        wait_share, demand = None, 0.0
        if new.report is not None and old.report is not None and new.report[0] > old.report[0]:
            span = new.report[0] - old.report[0]
            demand = (new.report[1] - old.report[1]) / span
            if self._credit.exposed_wait()[0] >= 0:
                wait_share = min(1.0, max(0.0, (new.report[2] - old.report[2]) / span))
        elif new.report is not None:  # the window starts before the first report
            demand = self._credit.pace()
            if self._credit.exposed_wait()[0] >= 0:
                wait_share = self._credit.exposed_wait()[1]
        p = self._session.stream.parallelism
        return Window(
            seconds=seconds,
            stages=stages,
            batches=produced,
            wait_share=wait_share,
            production=produced / busy,
            demand=demand,
            processes=p.processes,
            threads=p.threads,
            max_workers=self._max_workers,
            tokenizer=self._tokenizer,
        )

    def stats(self) -> pb.StreamStats:
        """The stream's figures since it opened, with the latest verdict."""
        self.tick()
        meter, session = self._session.stream.meter, self._session
        now = time.monotonic()
        stages = meter.stage_seconds()
        wait, share = self._credit.exposed_wait()
        produced = session.batches_produced
        busy = max(1e-9, now - self._opened - stages["queue_full"])
        real, padding, nbytes = meter.sent_totals()
        return pb.StreamStats(
            age_s=now - self._opened,
            stages=[pb.StageTime(stage=s, seconds=stages[s]) for s in STAGES],
            real_tokens=real,
            padding_tokens=padding,
            bytes_sent=nbytes,
            queue_fill=session.queued(),
            queue_depth=session.depth,
            client_wait_s=wait,
            client_wait_share=share,
            production_batches_per_s=produced / busy,
            verdict_kind=self.kind,
            verdict=self.line,
        )


class ServerTotals:
    """What every stream the server ran did: the ended streams' figures kept, the running
    ones' added when read (so the metrics' counters never go back)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ended = pb.ServerTotals()
        self._stages = dict.fromkeys(STAGES, 0.0)

    def opened(self) -> None:
        with self._lock:
            self._ended.streams_opened += 1

    def ended(self, info: pb.StreamInfo | None, code: str) -> None:
        """A stream ended with status `code` ("OK" for a clean end), `info` its last figures
        (None when it never ran)."""
        with self._lock:
            self._ended.stream_ends[code] += 1
            if info is not None:
                _add(self._ended, self._stages, info)

    def read(self, running: list[pb.StreamInfo]) -> pb.ServerTotals:
        """The totals with the `running` streams' figures added."""
        with self._lock:
            totals = pb.ServerTotals()
            totals.CopyFrom(self._ended)
            stages = dict(self._stages)
        for info in running:
            _add(totals, stages, info)
        totals.stages.extend(pb.StageTime(stage=s, seconds=stages[s]) for s in STAGES)
        return totals


def _add(totals: pb.ServerTotals, stages: dict[str, float], info: pb.StreamInfo) -> None:
    s = info.stats
    totals.batches_sent += info.batches_sent
    totals.real_tokens += s.real_tokens
    totals.padding_tokens += s.padding_tokens
    totals.bytes_sent += s.bytes_sent
    totals.client_wait_s += max(0.0, s.client_wait_s)
    totals.audited_groups += info.audited_groups
    totals.backend_groups += info.backend_groups
    totals.audit_mismatches += info.audit_mismatches
    totals.backend_failed_groups += info.backend_failed_groups
    for t in s.stages:
        stages[t.stage] += t.seconds


def tokenizer_figures(info: pb.StreamInfo, stream) -> None:
    """Who tokenizes `stream` (a `BatchStream`), why, and what its audits found."""
    choice = stream.pipeline.tokenizer.choice  # None: pre-tokenized, no model
    if choice is not None:
        info.tokenizer_backend, info.tokenizer_backend_why = choice.backend, choice.why
        info.tokenizer_backend_pending = choice.pending
    info.backend_groups, info.audited_groups, info.audit_mismatches = stream.meter.audits()
    info.backend_failed_groups = stream.meter.backend_failures()


def resharded(position) -> str:
    """What a stream resumed from a resharded state continues ("" for any other)."""
    if position.elastic is None:
        return ""
    (k, n), old = position.elastic["deal"], position.elastic["from"]
    return f"share {k} of {n} of what {len(old)} old streams left, then its own shard"


def log_open(stream_id: int, pipeline, label: str, opening, position) -> None:
    """The log line (and JSON event `stream_open`) of a stream that starts to serve."""
    p = opening.parallelism
    choice = pipeline.tokenizer.choice  # None: pre-tokenized, no model
    backend = "-" if choice is None else choice.backend
    elastic = resharded(position)
    log.info(
        "stream %d (%s): %d worker processes, %d threads (%s); tokenized by %s; token cache %s"
        + ("; resharded: %s" if elastic else "%s"),
        stream_id,
        label,
        p.processes,
        p.threads,
        opening.reason,
        backend,
        pipeline.cache_use,
        elastic,
        extra={
            "event": "stream_open",
            "fields": {
                "stream": stream_id,
                # A pipeline's name, or for a request's spec its first file and model
                # (bounded: `describe` keeps base names).
                "pipeline": label,
                "fingerprint": pipeline.fingerprint,
                "processes": p.processes,
                "threads": p.threads,
                "reason": opening.reason,
                "tokenizer_backend": backend,
                "tokenizer_backend_why": "" if choice is None else choice.why,
                "token_cache": pipeline.cache_use,
                "resharded": elastic,
            },
        },
    )
