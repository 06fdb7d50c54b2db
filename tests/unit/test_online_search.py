"""The online search (`autotune/online.py`) and the live capacity it reads (`autotune/live.py`),
on synthetic windows: where it walks, where it settles, what moves it again."""

from __future__ import annotations

import dataclasses

import pytest

from input_server.autotune.live import Window
from input_server.autotune.online import COOLDOWN_WINDOWS, OnlineSearch
from input_server.autotune.shared_cores import DEFAULT_SPREAD, SPREAD_BOUNDS, Cores
from input_server.batching.budget import StreamBudget
from input_server.batching.parallelism import Parallelism as P
from input_server.serving.verdict import INPUT_BOUND_WAIT


def default_threads(processes: int) -> int:
    return max(1, 8 // max(1, processes))


def window(
    rate: float, *, workers: int = 1, blocked: float = 0.0, busy: float = 1.0, seconds: float = 1.0
) -> Window:
    """A window at `rate` batches/s whose producer waited for room `blocked` of the time and
    whose parallel stage was `busy` (its in-order part idle while it waited)."""
    batches = int(rate * seconds)
    return Window(
        seconds=seconds,
        batches=batches,
        tokens=100 * batches,
        groups=batches,
        group_s=busy * workers * seconds,
        waiting_s=(1 - blocked) * seconds,
        blocked_s=blocked * seconds,
        workers=workers,
    )


def test_a_window_that_ran_free_is_its_own_capacity():
    w = window(50, blocked=0.0, busy=0.7)
    assert w.free_running and w.capacity() == 50


def test_a_throttled_window_scales_its_rate_by_the_bottlenecks_utilization():
    w = window(10, workers=2, blocked=0.8, busy=0.25)  # groups busy a quarter of the time
    assert not w.free_running
    assert w.bottleneck == "parallel"
    assert w.capacity() == pytest.approx(10 / 0.25)


def test_a_window_whose_loop_waited_for_data_is_its_own_capacity():
    """The producer waited for room (the server's own sends held it, sharing one GIL), yet
    the trainer waited for data: what reached the loop is all this parallelism delivers."""
    w = window(10, workers=2, blocked=0.8, busy=0.25)
    waited = dataclasses.replace(w, loop_wait_s=INPUT_BOUND_WAIT * w.seconds)
    assert waited.free_running and waited.capacity() == 10
    barely = dataclasses.replace(w, loop_wait_s=0.8 * INPUT_BOUND_WAIT * w.seconds)  # jitter
    assert not barely.free_running and barely.capacity() == pytest.approx(40)


def test_a_search_whose_loop_waits_climbs_as_if_it_took_all_it_was_given():
    """Windows whose loop waited: no demand is read from them (the loop's pace is what the
    stream delivered), so the search climbs past the pace instead of settling on the fewest
    workers that meet it."""
    loop = OnlineSearch(P(0, 1), cpus=8, default_threads=default_threads)
    step = loop.observe(
        dataclasses.replace(window(10, blocked=0.8, busy=0.25), loop_wait_s=0.5),
        demand=10.0,
        now=1.0,
    )
    assert step.to == P(0, 2), step.reason
    fed = OnlineSearch(P(0, 1), cpus=8, default_threads=default_threads)
    step = fed.observe(window(10, blocked=0.8, busy=0.25), demand=10.0, now=1.0)
    assert step.to != P(0, 2), step.reason


def capacities(per_thread: float, gil: float = 1.0):
    """Capacity of (processes, threads) for a stage whose threads add `per_thread` each, a
    fraction `gil` of that beyond the first."""

    def capacity(parallelism):
        return per_thread * (1 + gil * (parallelism.workers - 1))

    return capacity


def run(
    search: OnlineSearch, capacity, demand: float | None, *, windows: int = 30, now: float = 0.0
):
    """Feeds the search the windows its current parallelism would give, switching where it
    says; returns the parallelisms it ran and the time."""
    path = [search.current]
    for _ in range(windows):
        cap = capacity(search.current)
        if demand is None or demand >= cap:  # the loop takes all it makes
            w = window(cap, workers=search.current.workers)
        else:
            busy = demand / cap
            w = window(
                demand,
                workers=search.current.workers,
                blocked=1 - busy,
                busy=busy,
            )
        now += 1.0
        step = search.observe(w, demand=w.batches_per_s, now=now)
        if step.to is not None:
            search.switched(step.to)
            path.append(step.to)
    return path, now


def test_a_slow_loop_gets_the_fewest_workers_that_meet_its_demand_with_headroom():
    s = OnlineSearch(P(0, 8), cpus=8, default_threads=default_threads)
    path, _ = run(s, capacities(10), demand=24)  # needs 1.25 x 24 = 30: three threads' worth
    assert s.settled and s.current == P(0, 4)  # the ladder: 1, 2, 4, 8 threads; 2 give 20
    assert s.tuning.reason == "target met"
    assert path[:3] == [P(0, 8), P(0, 4), P(0, 2)] and path[-1] == P(0, 4)


def test_a_loop_that_takes_everything_gets_the_plateau():
    s = OnlineSearch(P(0, 1), cpus=8, default_threads=default_threads)
    # Threads add 10 each up to 4, nothing after.
    run(s, lambda c: 10 * min(4, c.workers), demand=None)
    assert s.settled and s.current == P(0, 4) and s.tuning.reason == "plateau"


def test_a_spec_target_overrides_the_measured_demand():
    s = OnlineSearch(P(0, 8), cpus=8, default_threads=default_threads, target=8)
    run(s, capacities(10), demand=None)  # a loop that takes everything, but the target is 8
    assert s.settled and s.current == P(0, 1)


def test_a_demand_that_moves_by_more_than_a_quarter_re_tunes_after_two_windows():
    s = OnlineSearch(P(0, 8), cpus=8, default_threads=default_threads)
    run(s, capacities(10), demand=6)
    assert s.settled and s.current == P(0, 1) and s.searches == 1
    # A 10 % move, for long: nothing. One window of a big move: nothing (hysteresis).
    run(s, capacities(10), demand=6.6, windows=COOLDOWN_WINDOWS + 5)
    assert s.settled and s.searches == 1
    cap = 10
    w = window(cap, workers=1)  # one window in which the loop took everything
    assert s.observe(w, demand=cap, now=100).to is None and s.settled
    assert s.observe(window(6, blocked=0.4, busy=0.6), demand=6, now=101).to is None
    # The loop speeds up 4 x: the stream falls behind, then re-tunes up to meet it.
    path, _ = run(s, capacities(10), demand=24, now=102)
    assert s.searches == 2 and s.settled and s.current == P(0, 4), path


def test_the_time_bound_settles_on_what_was_measured():
    s = OnlineSearch(P(0, 1), cpus=8, default_threads=default_threads, tune_seconds=2.5)
    run(s, capacities(10), demand=None, windows=6)
    assert s.settled
    assert s.tuning.reason == "time limit"  # the search was still gaining
    # Windows at 0, 1 and 2 s of the search lie within it; the one at 3 s ends it.
    assert sum(m.ran for m in s.tuning.measurements) == 4


def test_caps_bound_the_walk():
    s = OnlineSearch(P(0, 1), cpus=8, default_threads=default_threads, max_workers=2)
    run(s, capacities(10), demand=100)  # never enough: the cap stops it
    assert s.settled and s.current == P(0, 2)


def test_a_remembered_choice_starts_settled_and_watches():
    first = OnlineSearch(P(0, 8), cpus=8, default_threads=default_threads)
    run(first, capacities(10), demand=6)
    again = OnlineSearch(
        first.current, cpus=8, default_threads=default_threads, remembered=first.tuning
    )
    assert again.settled
    path, _ = run(again, capacities(10), demand=6, windows=10)
    assert path == [first.current] and again.searches == 0


def test_processes_the_server_cannot_give_are_passed_over():
    s = OnlineSearch(P(0, 16), cpus=8, default_threads=default_threads)
    # The loop wants more than 16 threads give; the next rung is 2 processes.
    step = s.observe(window(160, workers=16, blocked=0.5), demand=10_000, now=1)
    assert step.to == P(2, 4)
    asked = []
    while step.to is not None:  # a server with no worker processes to give
        asked.append(step.to)
        step = s.unavailable(step.to, now=1)
    assert asked == [P(2, 4), P(4, 2), P(8, 1)]
    assert s.settled and s.current == P(0, 16)
    assert any(m.skipped == "server's max workers" for m in s.tuning.measurements)


def test_a_loop_near_capacity_whose_windows_alternate_still_re_tunes():
    s = OnlineSearch(P(0, 8), cpus=8, default_threads=default_threads)
    run(s, capacities(10), demand=6)
    run(s, capacities(10), demand=6, windows=COOLDOWN_WINDOWS)
    assert s.settled and s.current == P(0, 1)
    # One window it took all 10 a second, the next 9.5 of them: both say "more".
    assert s.observe(window(10), demand=10, now=200).to is None
    step = s.observe(window(9.5, blocked=0.2, busy=0.95), demand=9.5, now=201)
    assert not s.settled and step.to == P(0, 2), step


def test_a_measured_parallelism_whose_processes_went_elsewhere_is_not_chosen_again():
    """Measured once, then its processes taken by another stream: the search must not keep
    settling on it (each refusal would search again, forever)."""
    s = OnlineSearch(P(0, 2), cpus=2, default_threads=lambda p: 1)
    s.observe(window(10, workers=2), demand=None, now=1)  # took all: plateau search
    s.switched(P(0, 4))
    s.observe(window(11, workers=4), demand=None, now=2)
    s.switched(P(2, 1))
    s.observe(window(30, workers=2), demand=None, now=3)  # processes: far faster
    s.switched(P(0, 2))  # say the search went back to measure again
    step = s.unavailable(P(2, 1), now=4)
    for _ in range(10):
        if step.to is None:
            break
        assert step.to != P(2, 1)
        s.switched(step.to)
        step = s.observe(window(10, workers=2), demand=None, now=5)
    assert s.tuning.parallelism != P(2, 1)


def test_threads_are_held_to_the_memory_budget(make_spec):
    spec = make_spec(workers={"count": "auto", "ram_budget_mb": 40})
    budget = StreamBudget.of(spec, limit_mb=float("inf"), queue_depth=4, per_message=1)
    s = OnlineSearch(P(0, 1), cpus=8, default_threads=default_threads, budget=budget)
    run(s, capacities(10), demand=None)  # 4 threads hold 32 MiB, 8 would hold 64
    assert s.settled and s.current == P(0, 4), s.tuning


def test_each_re_tune_waits_longer_before_the_next():
    """The windows ignored after a settle double with each search (no cycling searches)."""
    s = OnlineSearch(P(0, 8), cpus=8, default_threads=default_threads)
    at_settle = []
    for demand in (6, 24, 96):  # each 4 x the last: a re-tune once the cool-down has passed
        searches = s.searches
        for _ in range(30):
            was_settled = s.settled
            run(s, capacities(10), demand=demand, windows=1)
            if s.settled and not was_settled:
                at_settle.append(s._cooldown)
            if s.settled and s._cooldown == 0 and s.searches > searches - (demand == 6):
                break
    assert at_settle == [COOLDOWN_WINDOWS, 2 * COOLDOWN_WINDOWS, 4 * COOLDOWN_WINDOWS]


def test_no_worker_processes_are_spawned_when_the_hosts_idle_cores_cannot_pay_for_them():
    """Threads keep the cores busy (the server's own share looks GIL-bound, the loop beside it
    takes the rest): the search settles in process without a process rung; with an idle
    core measured, the same windows try processes."""

    def path_with(cpu_cores: float, host_cores: float) -> list[P]:
        s = OnlineSearch(P(0, 2), cpus=2, default_threads=lambda p: max(1, 2 // max(1, p)))
        path, now = [s.current], 0.0
        while not s.settled and now < 30:
            rate = {1: 80, 2: 100}.get(s.current.workers, 101)
            now += 1.0
            w = window(rate, workers=s.current.workers)
            step = s.observe(w, demand=rate, now=now, cpu_cores=cpu_cores, host_cores=host_cores)
            if step.to is not None:
                s.switched(step.to)
                path.append(step.to)
        assert s.settled
        return path

    busy = path_with(1.2, host_cores=1.95)
    assert all(p.in_process for p in busy), busy
    # 0.22 cores idle: processes' dearer batches would need 0.4 more (measured on 2 cores).
    assert all(p.in_process for p in path_with(1.55, host_cores=1.78))
    assert P(2, 1) in path_with(1.0, host_cores=1.2)
    assert P(2, 1) in path_with(1.2, host_cores=0.0)  # not measured: as before


def test_a_demand_walk_on_busy_cores_stops_at_threads():
    s = OnlineSearch(P(0, 1), cpus=2, default_threads=lambda p: 1)
    path, now = [s.current], 0.0
    for _ in range(20):  # the loop wants more than anything makes; the cores are busy
        now += 1.0
        w = window(10 * min(2, s.current.workers), workers=s.current.workers, blocked=0.5)
        step = s.observe(w, demand=100, now=now, cpu_cores=1.0, host_cores=2.0)
        if step.to is not None:
            s.switched(step.to)
            path.append(step.to)
    assert s.settled and all(p.in_process for p in path), path


@pytest.mark.parametrize(
    "host_cores, chosen",
    [
        (1.97, P(0, 1)),  # busy cores: the loop took most with the fewest threads
        (1.0, P(0, 4)),  # an idle core: the loop is not slowed by them; the headroom decides
    ],
    ids=["busy-cores-cheapest-the-loop-took-as-much", "idle-core-headroom-decides"],
)
def test_a_loop_sharing_busy_cores_gets_the_cheapest_at_which_it_took_as_much(host_cores, chosen):
    """A loop that shares the host's cores with the stream takes less the more threads the
    stream runs (Llama 3 with fastokens on 2 cores: 1 thread best); read from busy time, only
    4 threads seem to give 1.25 x its pace."""
    took = {1: 500.0, 2: 450.0, 4: 420.0}
    capacity = {1: 520.0, 2: 520.0, 4: 700.0}
    s = OnlineSearch(P(0, 2), cpus=2, default_threads=lambda p: 1)
    path, now = [s.current], 0.0
    while not s.settled and now < 30:
        n = s.current.workers
        w = window(took[n], workers=n, blocked=0.3, busy=took[n] / capacity[n])
        now += 1.0
        step = s.observe(w, demand=took[n], now=now, cpu_cores=0.9, host_cores=host_cores)
        if step.to is not None:
            s.switched(step.to)
            path.append(step.to)
    assert s.settled and s.tuning.parallelism == chosen, (path, s.tuning)
    assert s.tuning.reason == "target met"


def test_on_busy_cores_a_rung_left_on_one_slow_window_is_measured_again():
    """The loop's pace on shared cores jumps by a fifth between 1 s windows: a cheaper rung
    that read slow once is measured again before the dearer one is kept."""
    took = {1: [500.0], 2: [400.0, 480.0], 4: [450.0]}  # 2 threads: one slow window first
    path, s = walk_on_busy_cores(took, {1: 520.0, 2: 490.0, 4: 700.0})
    assert path[:4] == [P(0, 2), P(0, 4), P(0, 2), P(0, 1)], path
    assert s.tuning.parallelism == P(0, 1), s.tuning


def walk_on_busy_cores(
    took: dict[int, list[float]], capacity: dict[int, float]
) -> tuple[list[P], OnlineSearch]:
    """The path of a search whose loop shares busy cores, its windows' paces from `took`, and
    the search, settled."""
    s = OnlineSearch(P(0, 2), cpus=2, default_threads=lambda p: 1)
    path, now, seen = [s.current], 0.0, dict.fromkeys(took, 0)
    while not s.settled and now < 30:
        n = s.current.workers
        rate = took[n][min(seen[n], len(took[n]) - 1)]
        seen[n] += 1
        w = window(rate, workers=n, blocked=0.3, busy=rate / capacity[n])
        now += 1.0
        step = s.observe(w, demand=rate, now=now, cpu_cores=0.9, host_cores=2.0)
        if step.to is not None:
            s.switched(step.to)
            path.append(step.to)
    assert s.settled
    return path, s


def test_a_rung_left_on_a_window_past_the_loops_own_spread_is_not_measured_again():
    """2 threads' one window took 330 batches/s, 4 threads' 450: past the loop's window spread
    (a fifth until measured), so 2 threads are worse; a second look would cost the trainer a
    switch and a window (the docstrings' walk settled at 12.6 s looking twice)."""
    path, _ = walk_on_busy_cores({1: [500.0], 2: [330.0, 480.0], 4: [450.0]}, {2: 400.0, 4: 700.0})
    assert path == [P(0, 2), P(0, 4)], path


def test_the_spread_is_the_loops_own_once_it_was_measured():
    cores = Cores(2)
    a, b = P(0, 1), P(0, 2)
    assert cores.spread() == DEFAULT_SPREAD  # nothing measured twice yet
    for took in (100.0, 101.0, 99.0, 100.0):  # a steady loop: 1 % apart
        cores.add(b, seconds=1.0, server_cores=1.0, host_cores=2.0, took=took)
    assert cores.spread() == SPREAD_BOUNDS[0]  # held to the floor: a few quiet windows
    cores.add(a, seconds=1.0, server_cores=1.0, host_cores=2.0, took=85.0)
    # 85 x 1.05 = 89 is past 0.9 x 100 here, within 0.8 x 100 on an unmeasured loop.
    assert not cores.could_be_as_good(a, b)
    for took in (70.0, 130.0, 70.0, 130.0):  # a loop whose windows jump by 30 %
        cores.add(b, seconds=1.0, server_cores=1.0, host_cores=2.0, took=took)
    assert cores.spread() > DEFAULT_SPREAD and cores.could_be_as_good(a, b)
