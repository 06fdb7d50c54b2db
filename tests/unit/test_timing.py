"""StepTimer on real jax (CPU): device time awaited, data wait apart, exclusions, derived rates."""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import pytest

from input_client import step_histogram, timing
from input_client.timing import StepTimer


@jax.jit
def _matmul_chain(x):
    # Enough device work (~0.1 s on one CPU core) that an unawaited dispatch returns far sooner.
    for _ in range(12):
        x = jnp.tanh(x @ x)
    return x


@jax.jit
def _trivial(x):
    return x + 1


class FakeClock:
    """Stands in for `perf_counter` so step times are exact; `advance` is called inside a step."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(timing, "perf_counter", c)
    return c


def _step_taking(clock: FakeClock, seconds: float):
    """A real jax step during which the fake clock moves by `seconds`."""

    def fn(x):
        clock.advance(seconds)
        return _trivial(x)

    return fn


class SleepingBatches:
    """A data iterator that blocks `delay_s` per batch and counts it, as the client's does."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.wait_time_s = 0.0

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        time.sleep(self.delay_s)
        self.wait_time_s += time.perf_counter() - start
        return jnp.ones((4,))


def test_step_waits_for_device_work_to_finish():
    x = jnp.full((700, 700), 1e-3, jnp.float32)
    jax.block_until_ready(_matmul_chain(x))  # compile outside the measurement
    start = time.perf_counter()
    dispatched = _matmul_chain(x)
    dispatch_s = time.perf_counter() - start
    jax.block_until_ready(dispatched)
    full_s = time.perf_counter() - start
    # The premise: dispatch alone is much shorter than the work, so timing it would be wrong.
    assert dispatch_s < full_s / 5, (dispatch_s, full_s)

    timer = StepTimer()
    out = timer.step(_matmul_chain, x, name="train")
    assert out.is_ready()
    assert timer.records[0].step_s >= full_s / 2, (timer.records[0].step_s, full_s)


def test_heavy_step_measures_longer_than_trivial_one():
    x = jnp.full((700, 700), 1e-3, jnp.float32)
    timer = StepTimer()
    timer.step(_matmul_chain, x)  # compiles
    timer.step(_trivial, x)  # compiles
    timer.step(_matmul_chain, x, name="heavy")
    timer.step(_trivial, x, name="light")
    heavy, light = timer.records[2], timer.records[3]
    assert heavy.step_s > 5 * light.step_s, (heavy.step_s, light.step_s)


def test_host_callback_sleep_is_inside_step_time():
    def slow_identity(v):
        time.sleep(0.2)
        return v

    @jax.jit
    def step(v):
        return jax.pure_callback(slow_identity, jax.ShapeDtypeStruct(v.shape, v.dtype), v) * 2

    timer = StepTimer()
    timer.step(step, jnp.ones(3))
    assert timer.records[0].step_s >= 0.2


def test_data_wait_recorded_apart_from_step_time():
    batches = SleepingBatches(0.3)
    timer = StepTimer(data_source=batches)
    for _ in range(3):
        timer.step(_trivial, next(batches))
    for r in timer.records:
        assert r.data_wait_s == pytest.approx(0.3, abs=0.05)
        assert r.step_s < 0.25, "the sleep in next() leaked into step time"
    s = timer.summary()
    assert s["steps"] == 2
    assert s["total_data_wait_s"] == pytest.approx(0.6, abs=0.1)


def test_waits_before_the_timer_existed_are_not_counted():
    batches = SleepingBatches(0.0)
    batches.wait_time_s = 5.0
    timer = StepTimer(data_source=batches)
    batches.wait_time_s += 0.25
    timer.step(_trivial, jnp.ones(2))
    timer.step(_trivial, jnp.ones(2))
    assert [r.data_wait_s for r in timer.records] == pytest.approx([0.25, 0.0])


def test_explicit_data_wait_overrides_source():
    timer = StepTimer()
    timer.step(_trivial, jnp.ones(2), data_wait_s=0.125)
    assert timer.records[0].data_wait_s == 0.125


def test_first_step_is_compile_and_excluded_by_default(clock):
    timer = StepTimer()
    timer.step(_step_taking(clock, 9.0), jnp.ones(2))
    timer.step(_step_taking(clock, 1.0), jnp.ones(2))
    timer.step(_step_taking(clock, 3.0), jnp.ones(2), name="profile")
    assert [r.name for r in timer.records] == ["compile", "train", "profile"]
    assert [r.index for r in timer.records] == [0, 1, 2]
    assert [r.step_s for r in timer.records] == pytest.approx([9.0, 1.0, 3.0])

    s = timer.summary()
    assert (s["steps"], s["excluded"]) == (2, 1)
    assert s["total_step_s"] == pytest.approx(4.0)

    s = timer.summary(exclude=("compile", "profile"))
    assert (s["steps"], s["excluded"]) == (1, 2)
    assert s["median_step_s"] == pytest.approx(1.0)
    assert s["p90_step_s"] == pytest.approx(1.0)
    assert s["total_step_s"] == pytest.approx(1.0)

    s = timer.summary(exclude=())
    assert s["steps"] == 3
    assert s["total_step_s"] == pytest.approx(13.0)


def test_constructor_exclude_is_the_default(clock):
    timer = StepTimer(exclude=("profile",))
    timer.step(_step_taking(clock, 9.0), jnp.ones(2))
    timer.step(_step_taking(clock, 3.0), jnp.ones(2), name="profile")
    s = timer.summary()
    assert (s["steps"], s["excluded"]) == (1, 1)
    assert s["total_step_s"] == pytest.approx(9.0)


def test_median_and_p90(clock):
    timer = StepTimer(exclude=())
    for seconds in [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 7.0, 8.0, 9.0, 0.5]:
        timer.step(_step_taking(clock, seconds), jnp.ones(2))
    s = timer.summary()
    assert s["median_step_s"] == pytest.approx(5.0)
    assert s["p90_step_s"] == pytest.approx(9.0)


def test_input_bound_fraction_over_counted_steps_only(clock):
    timer = StepTimer()
    timer.step(_step_taking(clock, 50.0), jnp.ones(2), data_wait_s=50.0)  # compile: excluded
    timer.step(_step_taking(clock, 1.0), jnp.ones(2), data_wait_s=3.0)
    timer.step(_step_taking(clock, 1.0), jnp.ones(2), data_wait_s=1.0)
    s = timer.summary()
    assert s["total_data_wait_s"] == pytest.approx(4.0)
    assert s["input_bound_fraction"] == pytest.approx(4.0 / 6.0)


def test_tflops_and_tokens_from_step_time(clock):
    timer = StepTimer(tokens_per_step=1000, flops_per_step=4e12, num_devices=2)
    timer.step(_step_taking(clock, 2.0), jnp.ones(2))
    timer.step(_step_taking(clock, 0.5), jnp.ones(2), num_tokens=200)
    first, second = timer.records
    assert first.tflops_per_device == pytest.approx(1.0)
    assert first.tokens_per_s == pytest.approx(500.0)
    assert second.tflops_per_device == pytest.approx(4.0)
    assert second.num_tokens == 200
    assert second.tokens_per_s == pytest.approx(400.0)
    s = timer.summary(exclude=())
    # Both steps' work a device and tokens over their seconds together, not their rates' mean.
    assert s["tflops_per_device"] == pytest.approx(4.0 / 2.5)
    assert s["device_tokens_per_s"] == pytest.approx(1200 / 2.5)


def test_every_rate_is_tokens_over_the_time_it_names_not_a_mean_of_step_rates(clock):
    """The issue's noisy loop: device time read far above step + data wait with no data wait,
    a mean of per-step rates. Uneven steps with nothing between them: every rate is the same
    tokens over the same seconds, far from the mean of the steps' rates."""
    timer = StepTimer(tokens_per_step=1000, flops_per_step=2e12, num_devices=1, exclude=())
    times = [0.001] * 9 + [1.0]  # nine quick steps and one slow one
    for seconds in times:
        timer.step(_step_taking(clock, seconds), jnp.ones(2), data_wait_s=0.0)
    total_s = sum(times)
    mean_of_rates = sum(1000 / t for t in times) / len(times)
    s = timer.summary()
    assert s["device_tokens_per_s"] == pytest.approx(10_000 / total_s)
    assert mean_of_rates > 50 * s["device_tokens_per_s"]  # what was printed before
    assert s["tflops_per_device"] == pytest.approx(10 * 2.0 / total_s)
    assert s["step_and_wait_tokens_per_s"] == pytest.approx(s["device_tokens_per_s"])
    assert s["wall_tokens_per_s"] == pytest.approx(s["device_tokens_per_s"])
    rows = dict(line.split("  ", 1) for line in timer.format_summary().splitlines())
    printed = f"{10_000 / total_s:,.0f}"
    assert rows["tokens/s, device time"].strip() == printed
    assert rows["tokens/s, step + data wait"].strip() == printed
    assert rows["tokens/s, wall clock (whole loop)"].strip() == printed
    assert float(rows["TFLOP/s/device, device time"]) == pytest.approx(20 / total_s, rel=1e-3)


def test_num_devices_defaults_to_local_device_count(clock):
    timer = StepTimer(flops_per_step=1e12)
    timer.step(_step_taking(clock, 1.0), jnp.ones(2))
    assert timer.num_devices == jax.local_device_count()
    assert timer.records[0].tflops_per_device == pytest.approx(1.0 / jax.local_device_count())


def test_rates_unknown_without_counts(clock):
    timer = StepTimer()
    timer.step(_step_taking(clock, 1.0), jnp.ones(2))
    r = timer.records[0]
    assert r.tokens_per_s is None and r.tflops_per_device is None
    s = timer.summary(exclude=())
    assert s["device_tokens_per_s"] is None and s["tflops_per_device"] is None


def test_summary_with_nothing_counted():
    timer = StepTimer()
    s = timer.summary()
    assert s["steps"] == 0 and s["excluded"] == 0
    assert s["median_step_s"] is None and s["input_bound_fraction"] is None
    assert "n/a" in timer.format_summary()


def test_format_summary_shows_the_figures(clock):
    timer = StepTimer(tokens_per_step=4096, flops_per_step=2e12, num_devices=1)
    timer.step(_step_taking(clock, 7.0), jnp.ones(2))
    timer.step(_step_taking(clock, 0.25), jnp.ones(2), data_wait_s=0.25)
    text = timer.format_summary()
    assert "1 (1 excluded)" in text
    assert "250.00 ms" in text
    assert "50.0%" in text
    assert "16,384" in text
    assert "8" in next(line for line in text.splitlines() if line.startswith("TFLOP"))


def test_returns_the_step_output_unchanged():
    timer = StepTimer()
    out = timer.step(lambda a, *, b: {"sum": _trivial(a) + b, "n": 3}, jnp.ones(2), b=1.0)
    assert out["n"] == 3
    assert out["sum"].tolist() == [3.0, 3.0]


@pytest.mark.parametrize(
    "kwargs",
    [{"tokens_per_step": 0}, {"flops_per_step": -1.0}, {"num_devices": 0}]
    + [{"exclude": "compile"}, {"run_id": " "}, {"run_id": 7}],
)
def test_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        StepTimer(**kwargs)


def test_the_first_steps_data_wait_is_reported_apart_from_its_compile_time(clock):
    """The first batch's wait (a server's start-up) hid inside the excluded compile step."""
    timer = StepTimer()
    timer.step(_step_taking(clock, 9.0), jnp.ones(2), data_wait_s=11.5)  # compile
    timer.step(_step_taking(clock, 1.0), jnp.ones(2), data_wait_s=0.5)
    s = timer.summary()
    assert s["first_data_wait_s"] == pytest.approx(11.5)
    assert s["first_step_s"] == pytest.approx(9.0)
    assert s["total_data_wait_s"] == pytest.approx(0.5)  # the counted steps' only
    rows = dict(line.split("  ", 1) for line in timer.format_summary().splitlines())
    assert rows["first step's data wait"].strip() == "11.500 s"
    assert rows["first step (compile)"].strip() == "9.000 s"
    assert StepTimer().summary()["first_data_wait_s"] is None


def test_records_path_appends_each_step_as_it_is_recorded(clock, tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text('{"index": 0, "name": "earlier run"}\n')  # kept: the file is appended to
    timer = StepTimer(tokens_per_step=1000, flops_per_step=4e12, num_devices=2, records_path=path)
    timer.step(_step_taking(clock, 2.0), jnp.ones(2), data_wait_s=3.0)
    lines = path.read_text().splitlines()
    assert len(lines) == 2  # on disk before the next step: a killed run keeps it
    timer.step(_step_taking(clock, 0.5), jnp.ones(2), data_wait_s=0.25)
    records = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert records == [{"run": timer.run_id, **dataclasses.asdict(r)} for r in timer.records]
    assert records[1] == {
        "run": timer.run_id,
        "index": 1,
        "name": "train",
        "step_s": 0.5,
        "data_wait_s": 0.25,
        "wall_s": 0.5,  # the fake clock moved only inside the step
        "num_tokens": 1000,
        "tokens_per_s": 2000.0,
        "tflops_per_device": 4.0,
    }


def test_write_jsonl_writes_every_record(clock, tmp_path):
    timer = StepTimer()
    for seconds in (3.0, 1.0, 2.0):
        timer.step(_step_taking(clock, seconds), jnp.ones(2))
    path = tmp_path / "all.jsonl"
    path.write_text("old\n")  # replaced
    timer.write_jsonl(path)
    got = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["index"], r["name"], r["step_s"]) for r in got] == [
        (0, "compile", 3.0),
        (1, "train", 1.0),
        (2, "train", 2.0),
    ]


def test_wall_clock_tokens_per_s_counts_the_data_wait(clock):
    """An input-bound loop: fast on device, slow in all. The per-device-second rate alone
    (what a user read as 16.7 M tokens/s against a real ~21 k) says nothing of the wait."""
    timer = StepTimer(tokens_per_step=1000)
    clock.advance(10.0)  # the first batch's wait, in real time as in a loop
    timer.step(_step_taking(clock, 5.0), jnp.ones(2), data_wait_s=10.0)  # compile: excluded
    for _ in range(4):
        clock.advance(0.999)
        timer.step(_step_taking(clock, 0.001), jnp.ones(2), data_wait_s=0.999)
    assert timer.records[0].wall_s == pytest.approx(15.0)  # from the timer's creation
    s = timer.summary()
    assert s["device_tokens_per_s"] == pytest.approx(1e6)
    assert s["wall_tokens_per_s"] == pytest.approx(1000.0)
    assert s["step_and_wait_tokens_per_s"] == pytest.approx(1000.0)  # nothing else between
    rows = dict(line.split("  ", 1) for line in timer.format_summary().splitlines())
    assert rows["tokens/s, device time"].strip() == "1,000,000"
    assert rows["tokens/s, wall clock (whole loop)"].strip() == "1,000"
    assert StepTimer().summary()["wall_tokens_per_s"] is None


def test_wall_clock_counts_what_the_loop_does_between_steps(clock):
    """Logging, checkpoints, evaluation: real time the timer sees only as the gap between one
    step's end and the next one's. Step + data wait alone is kept apart, named as such."""
    timer = StepTimer(tokens_per_step=1000)
    timer.step(_step_taking(clock, 5.0), jnp.ones(2))  # compile: excluded, its real time too
    for _ in range(4):
        clock.advance(1.5 + 0.25)  # the loop's own work after the previous step, then the wait
        timer.step(_step_taking(clock, 0.25), jnp.ones(2), data_wait_s=0.25)
    assert [r.wall_s for r in list(timer.records)[1:]] == pytest.approx([2.0] * 4)
    s = timer.summary()
    assert s["total_wall_s"] == pytest.approx(8.0)
    assert s["total_other_s"] == pytest.approx(6.0)
    assert s["wall_tokens_per_s"] == pytest.approx(500.0)
    assert s["step_and_wait_tokens_per_s"] == pytest.approx(2000.0)
    rows = dict(line.split("  ", 1) for line in timer.format_summary().splitlines())
    assert rows["tokens/s, step + data wait"].strip() == "2,000"
    assert rows["tokens/s, wall clock (whole loop)"].strip() == "500"
    assert rows["total wall clock"].strip() == "8.000 s (6.000 s outside step and data wait)"


def test_a_loop_that_sleeps_after_each_step_reports_its_real_rate():
    """The issue's case on the real clock: 0.05 s of sleep after each step printed 8.8 M
    tokens/s against a real 6.3 k. The wall-clock rate is tokens over the loop's real time."""
    batches = SleepingBatches(0.005)
    timer = StepTimer(tokens_per_step=1000, data_source=batches)
    ends = []
    for _ in range(12):
        timer.step(_trivial, next(batches))
        ends.append(time.perf_counter())
        time.sleep(0.05)
    # The counted steps (all but the compiling first) span its end to the last step's end.
    real = 11 * 1000 / (ends[-1] - ends[0])
    s = timer.summary()
    assert s["wall_tokens_per_s"] == pytest.approx(real, rel=0.1)
    assert s["step_and_wait_tokens_per_s"] > 3 * real  # what used to be printed as wall clock
    assert s["total_other_s"] >= 11 * 0.05 * 0.9
    rows = dict(line.split("  ", 1) for line in timer.format_summary().splitlines())
    printed = float(rows["tokens/s, wall clock (whole loop)"].replace(",", ""))
    assert printed == pytest.approx(real, rel=0.1)


def test_each_line_names_its_run_so_two_runs_in_one_file_stay_apart(tmp_path):
    path = tmp_path / "steps.jsonl"
    first = StepTimer(records_path=path)
    for _ in range(3):
        first.step(_trivial, jnp.ones(2))
    second = StepTimer(records_path=path, run_id="lr-3e-4")
    for _ in range(2):
        second.step(_trivial, jnp.ones(2))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    expected = [(first.run_id, i) for i in range(3)] + [("lr-3e-4", i) for i in range(2)]
    assert [(r["run"], r["index"]) for r in lines] == expected
    assert first.run_id != StepTimer().run_id  # two timers made at once differ
    assert first.run_id[:8].isdigit() and first.run_id[8] == "T"  # sorts by start time


# Device times the window tests cycle through: a few alike, one slow.
STEP_S = (0.010, 0.012, 0.011, 0.050, 0.009, 0.013, 0.010, 0.0105, 0.2)


def test_a_run_longer_than_its_window_keeps_the_latest_records_and_writes_every_line(
    clock, tmp_path
):
    path = tmp_path / "steps.jsonl"
    timer = StepTimer(keep_records=50, records_path=path, exclude=())
    for i in range(200):
        timer.step(_step_taking(clock, STEP_S[i % 9]), jnp.ones(2))
        if i == 49:  # still every step: the median and p90 as exact as before
            s = timer.summary()
            exact = sorted(r.step_s for r in timer.records)
            assert s["median_step_s"] == step_histogram.percentile(exact, 50)
            assert s["p90_step_s"] == step_histogram.percentile(exact, 90)
    assert [r.index for r in timer.records] == list(range(150, 200))
    assert len(path.read_text().splitlines()) == 200  # the file keeps every step
    timer.write_jsonl(tmp_path / "kept.jsonl")
    kept = [
        json.loads(line)["index"] for line in (tmp_path / "kept.jsonl").read_text().splitlines()
    ]
    assert kept == list(range(150, 200))
    s = timer.summary()
    assert s["steps"] == 200
    assert s["total_step_s"] == pytest.approx(sum(STEP_S[i % 9] for i in range(200)))
    every = sorted(STEP_S[i % 9] for i in range(200))
    for key, q in (("median_step_s", 50), ("p90_step_s", 90)):
        assert s[key] == pytest.approx(
            step_histogram.percentile(every, q), rel=step_histogram.PERCENTILE_ACCURACY
        )


def test_the_step_time_histogram_is_within_its_accuracy_of_every_percentile():
    times = [0.0, 1e-6, 0.003, 0.0031, 0.02, 0.5, 2.0, 37.0] * 3 + [0.0105] * 5
    counts: dict[int, int] = {}
    for t in times:
        counts[step_histogram.bucket(t)] = counts.get(step_histogram.bucket(t), 0) + 1
    exact = sorted(times)
    for q in (0, 10, 25, 50, 90, 99, 100):
        got = step_histogram.histogram_percentile(counts, q)
        assert got == pytest.approx(
            step_histogram.percentile(exact, q), rel=step_histogram.PERCENTILE_ACCURACY
        )
