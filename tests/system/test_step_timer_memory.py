"""`StepTimer` over a million steps: its memory stays flat and every summary figure still
covers every step (issue 50: it kept each step's record for the whole run, about 360 bytes a
step, 360 MB a million steps in the trainer). Steps are timed on a fake clock, so the run takes
seconds and the exact figures are sums of known terms."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from input_client import step_histogram, timing
from input_client.timing import StepTimer

STEPS = 1_000_000
# The last steps, traced by tracemalloc (it makes each step several times slower): long past the
# window's filling, so whatever they leave behind is what every later step would. Memory is
# compared from a window's worth of steps into them: the records in the window then were all
# made under tracing, as they are at the end.
TRACED = 100_000

# Device times, data waits and the loop's own time between steps cycle through these; every
# 500th step is an evaluation (its own name, left out like the compile step) and every 7th
# counts fewer tokens.
STEP_S = (0.010, 0.012, 0.011, 0.050, 0.009, 0.013, 0.010, 0.0105, 0.2)
WAIT_S = (0.0, 0.001, 0.0005, 0.004)
OTHER_S = (0.0002, 0.0)
TOKENS = 4096


def _step(i: int) -> tuple[str | None, float, float, float, int | None]:
    """Step `i`'s name (None: the default), device time, data wait, loop time and tokens."""
    name = "eval" if i % 500 == 499 else None
    tokens = TOKENS // 2 if i % 7 == 3 else None
    return name, STEP_S[i % 9], WAIT_S[i % 4], OTHER_S[i % 2], tokens


def _expected() -> dict[str, float]:
    """The summary's sums over the counted steps (all but the first and the evaluations),
    added up directly, and every counted step time (for the percentiles)."""
    sums = dict.fromkeys(("steps", "step", "wait", "wall", "tokens"), 0.0)
    times: dict[float, int] = {}
    for i in range(1, STEPS):
        name, step_s, wait_s, other_s, tokens = _step(i)
        if name == "eval":
            continue
        n = tokens if tokens is not None else TOKENS
        sums["steps"] += 1
        sums["step"] += step_s
        sums["wait"] += wait_s
        sums["wall"] += other_s + wait_s + step_s
        sums["tokens"] += n
        times[step_s] = times.get(step_s, 0) + 1
    sums["times"] = sorted(t for t, n in times.items() for _ in range(n))
    return sums


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_million_steps_keep_memory_flat_and_every_figure_over_all_of_them(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "perf_counter", clock)
    timer = StepTimer(
        tokens_per_step=TOKENS, flops_per_step=1e12, num_devices=1, exclude=("compile", "eval")
    )
    step_s = 0.0

    def train_step():
        clock.now += step_s

    objects = []
    try:
        for i in range(STEPS):
            if i in (2 * timer.keep_records, STEPS - TRACED):
                gc.collect()
                objects.append(len(gc.get_objects()))
            if i == STEPS - TRACED:
                tracemalloc.start()
            if i == STEPS - TRACED + timer.keep_records:
                traced_from = tracemalloc.get_traced_memory()[0]
            name, step_s, wait_s, other_s, tokens = _step(i)
            clock.now += other_s + wait_s
            timer.step(train_step, name=name, num_tokens=tokens, data_wait_s=wait_s)
        gc.collect()
        grew = tracemalloc.get_traced_memory()[0] - traced_from
    finally:
        tracemalloc.stop()
    objects.append(len(gc.get_objects()))

    # Flat: the last steps left nothing behind (each record they made replaced an older one in
    # the window), and no object accumulated over the run once the window had filled.
    assert grew < 64 << 10, grew
    assert objects[-1] - objects[0] < 1000, objects
    assert len(timer.records) == timer.keep_records and timer.steps_timed == STEPS
    assert timer.records[-1].index == STEPS - 1

    e = _expected()
    s = timer.summary()
    assert (s["steps"], s["excluded"]) == (e["steps"], STEPS - e["steps"])
    busy = e["step"] + e["wait"]
    # Relative: the fake clock's own rounding far from 0 moves each step time a little.
    approx = {"rel": 1e-9}
    assert s["total_step_s"] == pytest.approx(e["step"], **approx)
    assert s["total_data_wait_s"] == pytest.approx(e["wait"], **approx)
    assert s["total_wall_s"] == pytest.approx(e["wall"], **approx)
    # A difference of two sums: as near as they are, measured against them.
    assert s["total_other_s"] == pytest.approx(e["wall"] - busy, abs=1e-9 * e["wall"])
    assert s["input_bound_fraction"] == pytest.approx(e["wait"] / busy, **approx)
    # Totals over device time: each counted step did `flops_per_step` on its one device.
    assert s["device_tokens_per_s"] == pytest.approx(e["tokens"] / e["step"], **approx)
    assert s["tflops_per_device"] == pytest.approx(e["steps"] / e["step"], **approx)
    assert s["step_and_wait_tokens_per_s"] == pytest.approx(e["tokens"] / busy, **approx)
    assert s["wall_tokens_per_s"] == pytest.approx(e["tokens"] / e["wall"], **approx)
    assert s["first_step_s"] == pytest.approx(STEP_S[0]) and s["first_data_wait_s"] == WAIT_S[0]
    for key, q in (("median_step_s", 50), ("p90_step_s", 90)):
        exact = step_histogram.percentile(e["times"], q)
        assert s[key] == pytest.approx(exact, rel=step_histogram.PERCENTILE_ACCURACY), key
    assert timer.summary(exclude=())["steps"] == STEPS
    badput = timer.badput()
    assert badput.steps == STEPS
    assert badput.step_wait_s == pytest.approx(sum(WAIT_S[i % 4] for i in range(1, STEPS)))
