"""Tuning an "auto" stream while it serves: measure windows, switch parallelism, remember.

The stream opened at a provisional parallelism; this thread reads its meter each window,
asks the online search (`autotune/online.py`) where to go, switches the stream there
(`batching/batch_stream.py`: the next batch comes from the new stage, the data unchanged), takes
or gives back the server's worker processes, and keeps the history that `input-server info`
shows. A settled choice is remembered for the spec's later streams and restarts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable

from input_server.autotune.live import Window, window
from input_server.autotune.measure import added_bytes, host_busy_seconds, tree_cpu_seconds
from input_server.autotune.measurements import Tuning
from input_server.autotune.online import OnlineSearch, Step
from input_server.autotune.openings import remembered_reason
from input_server.autotune.policy import SERVER_CAP
from input_server.batching.batch_stream import PendingSwitch, ServedStream
from input_server.batching.meter import LiveMeter, clock
from input_server.batching.parallelism import Parallelism
from input_server.serving.slots import ProcessReservation

log = logging.getLogger(__name__)

# A window lasts at least WINDOW_S and MIN_BATCHES batches; one that reaches MAX_WINDOW_S
# with fewer (a loop that pauses, e.g. to evaluate or checkpoint) is dropped, not judged.
WINDOW_S = 1.0
MIN_BATCHES = 4
MAX_WINDOW_S = 10.0
# After a switch, the new stage's warm-up (threads filling, processes starting) is not timed.
WARMUP_S = 1.0
# Worker processes warm up longer: they start one after another and each loads its
# tokenizer, so their first batches come before the last of them is making groups; a window
# a second after the first batch read 2 x 1 well below its settled rate on a 2-core host, and
# the search left it for fewer threads (docs/benchmarks.md, '"auto" on this 2-core host when
# its trainer waits').
PROCESS_WARMUP_S = 3.0
# Windows in a row whose tuning failed before it stops for the stream (the stream goes on).
MAX_FAILURES = 3
# A window across a trial of the tokenizer's backend against the reference (`speed.Trial`:
# a phase of its groups by the slower side) times the trial, not the parallelism: dropped,
# up to this many in a row (a trial that keeps starting over does not stop the search).
MAX_TRIAL_WINDOWS = 5
# Why a stream that opened short of its remembered choice (`Opening.bridged`) switched to it.
BRIDGE_REASON = "remembered: its first batch made in process"


@dataclasses.dataclass(frozen=True)
class Switch:
    """One change of a stream's parallelism, as `input-server info` lists it."""

    at_s: float  # since the stream opened
    before: Parallelism
    after: Parallelism
    reason: str
    capacity: float  # batches/s measured at `before` in the window that decided
    demand: float  # the loop's batches/s then (0: it took all the stream made)


class StreamTuner:
    """One "auto" stream's online tuning, on a thread of its own until `stop`.

    Args:
      stream: the stream, switchable, with its meter.
      search: the online search, started at the stream's parallelism.
      taken: the batches the loop has taken so far (its credit, or what was sent).
      processes: the stream's worker processes, reserved against the server's; its switches
        grow and shrink them.
      remember: called with a settled choice (not one the server's free processes cut).
      reason: why the stream runs as it opened (`Opening.reason`), until a switch or a
        settled choice says otherwise.
      stream_id: the stream's id, in its log lines.
      trials: the tokenizer's trials begun and whether one runs (`Tokenizer.trials`).
      waited: the trainer's exposed data wait so far, in seconds, as its client reports it
        (-1: its client does not say); a window in which the loop waited for data is one in
        which it took all the stream made (`live.Window.free_running`).
    """

    def __init__(
        self,
        stream: ServedStream,
        search: OnlineSearch,
        *,
        taken: Callable[[], int],
        processes: ProcessReservation,
        remember: Callable[[Tuning], None],
        reason: str = "",
        stream_id: int = 0,
        trials: Callable[[], tuple[int, bool]] = lambda: (0, False),
        waited: Callable[[], float] = lambda: -1.0,
    ):
        self.stream = stream
        self.stream_id = stream_id  # what its log lines name
        self.search = search
        self.history: list[Switch] = []
        self.demand = 0.0
        self.reason = reason
        self._meter: LiveMeter = stream.meter
        self._taken = taken
        self._processes = processes
        self._remember = remember
        self._opened = clock()
        self._stop = threading.Event()
        self._asked: PendingSwitch | None = None  # the latest switch asked of the stream
        self._trials = trials
        self._waited = waited
        self._dropped = 0  # windows dropped in a row for a trial
        self._thread = threading.Thread(target=self._run, name="stream-tuner", daemon=True)

    def start(self) -> StreamTuner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._meter.wake()
        if self._asked is not None:
            self.stream.withdraw(self._asked)

    def join(self, timeout: float | None = None) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout)

    @property
    def state(self) -> str:
        return "settled" if self.search.settled else "searching"

    def _run(self) -> None:
        failures = 0
        try:
            self._leave_bridge()
        except Exception:  # noqa: BLE001 - the stream goes on where it runs, and is tuned there
            log.warning("switching to the remembered choice failed", exc_info=True)
        self._warm_up()
        while not self._stop.is_set():
            try:
                measured = self._window()
                if measured is None:
                    continue
                window, demand, cpu_cores, host_cores = measured
                rss_mb = self._workers_added_mb()
                step = self._observe(window, demand, cpu_cores, rss_mb, host_cores)
                self._follow(step, window, demand)
                failures = 0
            except Exception:  # noqa: BLE001 - tuning must never end the stream it serves
                failures += 1
                log.warning("stream tuning failed (%d in a row)", failures, exc_info=True)
                if failures >= MAX_FAILURES:
                    log.warning(
                        "stream tuning stopped; the stream goes on at %s", self.stream.parallelism
                    )
                    return
                self._stop.wait(WINDOW_S)

    def _observe(
        self,
        window: Window,
        demand: float,
        cpu_cores: float,
        rss_mb: float,
        host_cores: float = 0.0,
    ) -> Step:
        """The search's step for this window; a search it starts again shows in `reason`."""
        was_settled = self.search.settled
        step = self.search.observe(
            window,
            demand=demand,
            now=clock(),
            cpu_cores=cpu_cores,
            rss_mb=rss_mb,
            host_cores=host_cores,
        )
        if was_settled and not self.search.settled:
            # The settled (or remembered) choice's reason no longer says why the stream runs
            # as it does; a switch the search makes replaces this with its own.
            self.reason = "auto: searching…" + (f" ({step.reason})" if step.reason else "")
        return step

    def _follow(self, step: Step, window: Window, demand: float | None) -> None:
        while step.to is not None and not self._stop.is_set():
            if step.to == self.stream.parallelism:
                break
            if self._processes.grow_to(step.to.processes) and self._switch(step, window, demand):
                return
            if self._stop.is_set() or self.stream.closed:
                return
            # The server's processes are taken, or the stage would not open: search without it.
            step = self.search.unavailable(step.to, clock())
        if self.search.settled and step.reason:
            self._settled()

    def _settled(self) -> None:
        tuning = self.search.tuning
        self.reason = f"auto: {tuning.summary()}"
        log.info("stream tuning settled: %s", tuning.summary())
        if not any(m.skipped == SERVER_CAP for m in tuning.measurements):
            self._remember(tuning)

    def _switch(self, step: Step, window: Window, demand: float | None) -> bool:
        """Switches to `step.to`; False if the stream stopped first or the stage would not
        open (the stream goes on as it was, and keeps only the processes it runs)."""
        before, after = self.stream.parallelism, step.to
        record = Switch(
            clock() - self._opened,
            before,
            after,
            step.reason,
            window.capacity(),
            demand or 0.0,
        )
        if not self._make(record):
            return False
        self.reason = f"auto: {step.reason}"
        if self.search.settled:
            self._settled()
        self._warm_up()
        return True

    def _leave_bridge(self) -> None:
        """The remembered choice the stream opened short of (`Opening.bridged`: the search
        starts settled on it, the stream elsewhere), switched to once its first batch is out;
        one that will not open leaves the search to go on from where the stream runs."""
        remembered = self.search.tuning if self.search.settled else None
        if remembered is None or remembered.parallelism == self.stream.parallelism:
            return
        to = remembered.parallelism
        self._first_batch()
        if self._stop.is_set():
            return
        before = self.stream.parallelism
        record = Switch(clock() - self._opened, before, to, BRIDGE_REASON, 0.0, 0.0)
        if self._make(record):
            self.reason = remembered_reason(self.search.tuning)
        elif not self._stop.is_set() and not self.stream.closed:
            # The search goes on without it from the next window, where the stream runs (the
            # step it proposes now would be judged on no window of its own).
            self.search.unavailable(to, clock())
            self.reason = (
                f"auto: searching… (the remembered {to.processes} x {to.threads} would not open)"
            )

    def _make(self, record: Switch) -> bool:
        """Asks the stream for `record.after` and waits until it is made (then recorded) or
        not: stopped meanwhile, the stream ended, or the stage would not open."""
        before, after = record.before, record.after
        log.info(
            "stream %d tuning: %d x %d -> %d x %d (%s)",
            self.stream_id,
            before.processes,
            before.threads,
            after.processes,
            after.threads,
            record.reason,
            extra={
                "event": "stream_switch",
                "fields": {
                    "stream": self.stream_id,
                    "from_processes": before.processes,
                    "from_threads": before.threads,
                    "to_processes": after.processes,
                    "to_threads": after.threads,
                    "reason": record.reason,
                },
            },
        )
        # The producer switches before its next batch (a loop that is not taking may keep it
        # waiting); the old stage's processes stay the stream's until they are gone. `stop`
        # withdraws the switch, or waits here for the one being made.
        self._asked = self.stream.switch(after)
        if self._stop.is_set():
            self.stream.withdraw(self._asked)
        self._asked.wait()
        if not self._asked.made:
            self._processes.shrink_to(before.processes)
            return False
        self.history.append(record)
        self.search.switched(after)
        self._processes.shrink_to(after.processes)
        return True

    def _warm_up(self) -> None:
        """Waits for the stage's first batch and WARMUP_S more (PROCESS_WARMUP_S with worker
        processes)."""
        self._first_batch()
        self._stop.wait(PROCESS_WARMUP_S if self.stream.parallelism.processes else WARMUP_S)

    def _first_batch(self) -> None:
        start = self._meter.totals().batches
        self._meter.wait_batches(start + 1, None, until=self._stop.is_set)

    def _window(self) -> tuple[Window, float, float, float] | None:
        """The next window: what the stream did, the loop's pace, the CPU cores the server's
        process tree kept busy and those busy on the whole host."""
        start, taken0, trials0 = self._meter.totals(), self._taken(), self._trials()
        waited0 = self._waited()
        cpu0, host0 = tree_cpu_seconds(), host_busy_seconds()
        # Long enough in time first (a sleep), then in batches (woken by the meter's batches,
        # not by a clock): a loop at a few batches a second pays for no polling.
        if self._stop.wait(WINDOW_S):
            return None
        left_s = MAX_WINDOW_S - (clock() - start.at)
        self._meter.wait_batches(
            start.batches + MIN_BATCHES, max(0.0, left_s), until=self._stop.is_set
        )
        if self._stop.is_set():
            return None
        now = self._meter.totals()
        waited1 = self._waited()
        loop_wait_s = waited1 - waited0 if min(waited0, waited1) >= 0 else -1.0
        measured = window(start, now, self.stream.parallelism.workers, loop_wait_s)
        cpu_cores = (tree_cpu_seconds() - cpu0) / max(measured.seconds, 1e-9)
        host_cores = (host_busy_seconds() - host0) / max(measured.seconds, 1e-9)
        if measured.batches < MIN_BATCHES or self._across_trial(trials0):
            return None
        demand = (self._taken() - taken0) / measured.seconds
        self.demand = 0.0 if measured.free_running and self.search.target <= 0 else demand
        return measured, demand, cpu_cores, host_cores

    def _across_trial(self, before: tuple[int, bool]) -> bool:
        """Whether a window that began at `before` (the tokenizer's trials) is to be dropped:
        a trial ran in it, and fewer than MAX_TRIAL_WINDOWS were dropped before it in a row."""
        after = self._trials()
        if (before[1] or after[1] or after[0] != before[0]) and self._dropped < MAX_TRIAL_WINDOWS:
            self._dropped += 1
            return True
        self._dropped = 0
        return False

    def _workers_added_mb(self) -> float:
        import psutil

        total = 0
        try:
            workers = self.stream.worker_processes()
        except RuntimeError:
            return 0.0
        for _, process in workers:
            with contextlib.suppress(psutil.Error):  # ended meanwhile: it adds nothing now
                total += added_bytes(psutil.Process(process.pid))
        return total / (1 << 20)
