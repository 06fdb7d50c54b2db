"""Tuning a live stream: which parallelism to switch to next, from measured windows. Pure.

A stream of "auto" starts at once at a provisional parallelism (the remembered choice, its
first batch perhaps made in process first, else the in-process opening) and this search moves
it while it serves (`serving/retune.py` runs it; `batching/batch_stream.py` switches without
changing a batch). Each candidate's row is its capacity measured on the live stream
(`live.Window.capacity`), so the offline policy's pure functions decide here too:

- the loop takes all the stream makes (no demand known): the offline search upward
  (`search.next_candidate`) and the plateau rule (`policy.decide`): the fewest workers within
  a few % of the fastest;
- the loop takes less (its demand measured from its credit) or the spec sets
  `target_batches_per_s`: a walk along the ladder of candidates, cheaper while the current
  one meets TARGET_HEADROOM x the demand, dearer while it does not; the choice is the fewest
  that meet it (`decide` with the target), leaving the host's other CPUs to training.

Settled, it watches: a demand that moves by more than DEMAND_MOVE, or production falling
behind a loop it used to keep ahead of, in CONFIRM_WINDOWS windows in a row (hysteresis: one
noisy window does not move it) starts a new search from where the stream is.
"""

from __future__ import annotations

import dataclasses

from input_server.autotune.live import Window
from input_server.autotune.measurements import Measurement, Tuning
from input_server.autotune.policy import (
    SERVER_CAP,
    TARGET_HEADROOM,
    contenders,
    decide,
    over_cap,
    pool,
)
from input_server.autotune.search import ladder, next_candidate
from input_server.autotune.shared_cores import Cores
from input_server.batching.budget import UNBOUNDED, StreamBudget
from input_server.batching.parallelism import Parallelism

DEMAND_MOVE = 0.25
# While the loop takes all the stream makes, the trainer waits for data: more workers than
# cores count when they gain this much in windows measured twice (the offline search, whose
# windows are single, asks `policy.OVERSUBSCRIBE_GAIN`). On the development host 4 threads on
# 2 cores gave 13 % more than 2, steadily (docs/benchmarks.md, "Online autotune").
ONLINE_OVERSUBSCRIBE_GAIN = 0.05
CONFIRM_WINDOWS = 2
# Windows a settled stream ignores its triggers after settling: the new parallelism warms up.
COOLDOWN_WINDOWS = 3
MAX_COOLDOWN_WINDOWS = 60


@dataclasses.dataclass(frozen=True)
class Step:
    """What the search asks for after a window: switch to `to` (None: stay), and why."""

    to: Parallelism | None
    reason: str


class OnlineSearch:
    """The state of one stream's online tuning; `observe` each measured window of the
    current parallelism (after its warm-up), switch where the returned `Step` says.

    Args:
      start: the provisional parallelism the stream opened with.
      cpus, default_threads: the host's cores, and threads per process by default.
      target: the spec's `target_batches_per_s` (0 = measure the loop's demand).
      max_workers: the spec's cap on workers.
      tune_seconds: a search settles on what it has measured by then.
      remembered: the stream runs a remembered choice (or is about to: `Opening.bridged`):
        begin settled, for this demand (0 = the loop took all).
      budget: the stream's memory budget: each candidate's groups in flight and its worker
        processes' measured memory are held to what it leaves them (`StreamBudget.groups_mb`);
        the default bounds nothing.
    """

    def __init__(
        self,
        start: Parallelism,
        *,
        cpus: int,
        default_threads,
        target: float = 0.0,
        max_workers: int = 0,
        tune_seconds: float = 20.0,
        remembered: Tuning | None = None,
        budget: StreamBudget = UNBOUNDED,
    ):
        self.current = start
        self.cpus = cpus
        self.target = target
        self.caps = dict(max_workers=max_workers, ram_budget_mb=budget.groups_mb())
        self.tune_seconds = tune_seconds
        self.budget = budget
        self.ladder = ladder(cpus, default_threads=default_threads)
        self.rows: list[Measurement] = []
        self.tuning: Tuning | None = remembered
        self.settled = remembered is not None
        self.demand: float | None = (
            (remembered.target_batches_per_s or None) if remembered else None
        )
        self.searches = 0 if remembered else 1
        self._search_started: float | None = None
        self._unavailable: set[Parallelism] = set()  # over the server's free processes
        self._cores = Cores(cpus)  # each candidate's busy cores and the loop's pace
        self._streak: list[str] = []
        self._cooldown = COOLDOWN_WINDOWS if remembered else 0
        self._now = 0.0

    # --- the windows ----------------------------------------------------------------------

    def observe(
        self,
        w: Window,
        *,
        demand: float | None,
        now: float,
        cpu_cores: float = 0.0,
        rss_mb: float = 0.0,
        host_cores: float = 0.0,
    ) -> Step:
        """Takes one window of the current parallelism; `demand` is the loop's measured pace
        in batches/s (None when it took all the stream made), `host_cores` the host's busy
        cores meanwhile, every process counted (0: not measured)."""
        self._now = now
        took = w.batches_per_s if demand is None else demand
        if self.target > 0:
            demand = self.target
        elif w.free_running:
            demand = None
        # Memory: the groups in flight (as the server's budget counts them) and the worker
        # processes' measured memory (`measure.added_bytes`), so the caps hold for threads too.
        row = Measurement(
            parallelism=self.current,
            batches_per_s=w.capacity(),
            tokens_per_s=w.tokens_capacity(),
            cpu_cores=cpu_cores,
            rss_mb=self.budget.window_mb(self.current, rss_mb),
            seconds=w.seconds,
            batches=w.batches,
        )
        if host_cores > 0:
            self._cores.add(
                self.current,
                seconds=w.seconds,
                server_cores=cpu_cores,
                host_cores=host_cores,
                took=took,
            )
        if self.settled:
            return self._watch(row, demand, now)
        if self._search_started is None:
            self._search_started = now
        self._record(row)
        return self._search(demand, now)

    def switched(self, parallelism: Parallelism) -> None:
        """The stream now runs `parallelism` (the windows that follow are its)."""
        self.current = parallelism

    def unavailable(self, parallelism: Parallelism, now: float) -> Step:
        """The server could not give `parallelism` its worker processes: search without it."""
        self._now = now
        self.settled = False  # a settled choice it cannot run is no choice
        self._unavailable.add(parallelism)
        self.rows.append(Measurement(parallelism=parallelism, skipped=SERVER_CAP))
        return self._search(self.demand, now)

    def _record(self, row: Measurement) -> None:
        for i, r in enumerate(self.rows):
            if r.ran and r.parallelism == self.current:
                self.rows[i] = pool(r, row)
                return
        self.rows.append(row)

    def _row(self, parallelism: Parallelism) -> Measurement | None:
        return next((r for r in self.rows if r.ran and r.parallelism == parallelism), None)

    def _host_busy(self) -> bool:
        """Whether the host had too few idle cores for worker processes to gain."""
        return self._cores.busy(self.rows)

    def _as_good(self, cheap: Parallelism, dear: Parallelism) -> bool:
        """Whether, on busy cores (`_host_busy`), the loop took as much (within PLATEAU_GAIN)
        while `cheap` ran as while `dear` did: a loop that shares the cores gains nothing from
        the stream's extra workers (they take CPU from it; its capacity, read from busy time,
        is then no guide)."""
        return self._host_busy() and self._cores.as_good(cheap, dear)

    # --- searching ------------------------------------------------------------------------

    def _search(self, demand: float | None, now: float) -> Step:
        self.demand = demand
        out_of_time = now - (self._search_started or now) >= self.tune_seconds
        host_busy = self._host_busy()
        if demand is None:
            nxt = next_candidate(self.rows, cpus=self.cpus, host_busy=host_busy, **self.caps)
            if out_of_time and nxt is not None and not nxt.skip:
                # Still gaining when the bound came: the choice says so ("time limit").
                self.rows.append(Measurement(parallelism=nxt.parallelism, skipped="time limit"))
                return self._settle(None, "the time bound")
            if nxt is not None and nxt.parallelism in self._unavailable:
                nxt = None
            if nxt is None or nxt.skip:
                again = self._measure_again()
                if again is not None:
                    return again
                return self._settle(None, "the loop takes all the stream makes")
            return Step(
                nxt.parallelism,
                "searching: the loop takes all the stream makes; trying more workers",
            )
        if out_of_time:
            return self._settle(demand, "the time bound")
        need = TARGET_HEADROOM * demand
        here = self._row(self.current)
        # Or, on busy cores, the loop took as much here as at a dearer rung that meets it.
        meets = here is not None and (
            here.batches_per_s >= need
            or any(
                (r := self._row(d)) is not None
                and r.batches_per_s >= need
                and self._as_good(self.current, d)
                for d in self.ladder
                if d > self.current
            )
        )
        rungs = [
            c
            for c in self.ladder
            if c not in self._unavailable and self._fits(c) and not (host_busy and c.processes)
        ]
        if meets:
            # Down past the cheaper rungs already measured to meet this need, to the first not
            # measured: a rung measured when the loop asked more (a loop that shares the cores
            # takes more when the stream takes less CPU) may have been left too soon.
            for c in reversed([c for c in rungs if c < self.current]):
                r = self._row(c)
                if r is None:
                    return Step(
                        c,
                        f"searching: meets {need:.1f} batches/s "
                        f"({TARGET_HEADROOM:g} x the demand); trying fewer",
                    )
                if r.batches_per_s < need and not self._as_good(c, self.current):
                    # One window on busy cores is noisy: a second, unless it fell past the
                    # loop's own window spread (then the second look costs a switch and a
                    # window for nothing).
                    if (
                        r.samples < 2
                        and self._host_busy()
                        and self._cores.could_be_as_good(c, self.current)
                    ):
                        return Step(c, f"searching: measuring {c} again")
                    break
            return self._settle(demand, "the demand")
        dearer = [c for c in rungs if c > self.current]
        for c in dearer:
            r = self._row(c)
            if r is None:
                return Step(
                    c,
                    f"searching: below {need:.1f} batches/s "
                    f"({TARGET_HEADROOM:g} x the demand); trying more",
                )
            if r.batches_per_s >= need:
                break
        return self._settle(demand, "the demand")

    def _choosable(self) -> list[Measurement]:
        """The rows a choice may fall on: not a parallelism the server could not give (its
        processes went to other streams), unless the stream runs it now."""
        return [
            r
            for r in self.rows
            if not r.ran  # a skipped row says why, and stays
            or r.parallelism not in self._unavailable
            or r.parallelism == self.current
        ]

    def _decide(self, demand: float | None) -> Tuning:
        return decide(
            self._choosable(),
            target_batches_per_s=demand or 0.0,
            cpus=self.cpus,
            oversubscribe_gain=ONLINE_OVERSUBSCRIBE_GAIN,
            **self.caps,
        )

    def _measure_again(self) -> Step | None:
        """A second window for the choice and its close contenders, as the offline search
        takes one: a single window on a busy host is noisy. None when each has had two."""
        tuning = self._decide(None)
        for m in (tuning.chosen, *contenders(self._choosable(), tuning, cpus=self.cpus)):
            p = m.parallelism
            if m.samples < 2 and p not in self._unavailable:
                return Step(None if p == self.current else p, f"searching: measuring {p} again")
        return None

    def _fits(self, c: Parallelism) -> bool:
        measured = [r for r in self.rows if r.ran and not r.parallelism.in_process]
        # The last measured process row predicts c's processes (its groups apart).
        last = (measured[-1].parallelism, measured[-1].rss_mb) if measured else None
        return not over_cap(c.workers, self.budget.candidate_mb(c, last), **self.caps)

    def _settle(self, demand: float | None, why: str) -> Step:
        tuning = self._cheapest_as_good(self._decide(demand))
        self.tuning = dataclasses.replace(tuning, tune_seconds=self._elapsed())
        self.settled = True
        # A demand no candidate met is a loop that takes all the stream makes: its pace then
        # follows production, and a faster stage "moving" it is no reason to search again.
        self.demand = demand if tuning.reason == "target met" else None
        self._streak = []
        # Each re-tune waits longer before the next (a capacity misread at low load must not
        # make the stream cycle between searches).
        self._cooldown = min(MAX_COOLDOWN_WINDOWS, COOLDOWN_WINDOWS * 2 ** (self.searches - 1))
        to = tuning.parallelism
        if to.in_process and self.cpus > 1 and self._host_busy():
            why += "; no worker processes tried: too few idle cores for them to gain"
        return Step(None if to == self.current else to, f"settled for {why}: {tuning.reason}")

    def _cheapest_as_good(self, tuning: Tuning) -> Tuning:
        """`tuning`, or for a demand met, the cheapest candidate at which the loop took as much
        (`_as_good`): on busy cores the headroom read from busy time is no guide."""
        p = tuning.parallelism
        cheaper = [
            r.parallelism
            for r in self._choosable()
            if r.ran and r.parallelism < p and self._as_good(r.parallelism, p)
        ]
        if tuning.reason != "target met" or not cheaper:
            return tuning
        c = min(cheaper)
        detail = f"the loop, sharing busy cores, took as much at {c} as at {p} ({tuning.detail})"
        return dataclasses.replace(tuning, parallelism=c, detail=detail)

    def _elapsed(self) -> float:
        return 0.0 if self._search_started is None else self._now - self._search_started

    # --- settled --------------------------------------------------------------------------

    def _watch(self, row: Measurement, demand: float | None, now: float) -> Step:
        if self._cooldown > 0:
            self._cooldown -= 1
            return Step(None, "")
        # Any reason in each of CONFIRM_WINDOWS windows in a row: near its capacity a loop's
        # windows alternate between "took everything" and "took more", both saying "more".
        trigger = self._trigger(row, demand)
        self._streak = [*self._streak, trigger][-CONFIRM_WINDOWS:] if trigger else []
        if len(self._streak) < CONFIRM_WINDOWS:
            return Step(None, "")
        self.settled = False
        self.searches += 1
        self.rows = [row]
        # Other candidates' figures are of another time; the current one's go on.
        self._cores.keep_only(self.current)
        self._unavailable.clear()
        self._search_started = now
        self._streak = []
        step = self._search(demand, now)
        return Step(step.to, f"re-tuning: {trigger}; {step.reason}")

    def _trigger(self, row: Measurement, demand: float | None) -> str:
        """Why the settled choice no longer fits this window, or ""."""
        if self.demand is not None and demand is None:
            if any(c > self.current for c in self.ladder):
                return "production fell behind the loop"
            return ""
        if demand is None:
            return ""
        if self.demand is None:
            # Chosen while the loop took everything; now it takes less: fewer may do.
            cheaper = any(c < self.current for c in self.ladder)
            if cheaper and TARGET_HEADROOM * demand < (1 - DEMAND_MOVE) * row.batches_per_s:
                return "the loop now takes less than the stream makes"
            return ""
        if abs(demand - self.demand) > DEMAND_MOVE * self.demand:
            return f"the demand moved from {self.demand:.1f} to {demand:.1f} batches/s"
        return ""
