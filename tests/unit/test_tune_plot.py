"""`tune --plot`: integer worker ticks, and the choice's star drawn whole at the top; the
choice's wording (counts in the singular, the 2 % rule docs/spec.md states); bench's up-front
time."""

from __future__ import annotations

import matplotlib
import pytest

from input_server.autotune import policy, report
from input_server.autotune.measurements import Measurement, Tuning
from input_server.batching.parallelism import Parallelism

matplotlib.use("Agg")


@pytest.fixture
def drawn(tmp_path, monkeypatch):
    """The figure `report.plot` drew, kept open for inspection."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    tuning = Tuning(
        parallelism=Parallelism(0, 4),
        reason="fastest",
        detail="",
        measurements=tuple(
            Measurement(parallelism=Parallelism(0, t), batches_per_s=r, tokens_per_s=r * 1000)
            for t, r in ((1, 10.0), (2, 19.0), (4, 30.0))
        ),
    )
    report.plot(tuning, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 0
    fig = figures[0]
    fig.canvas.draw()
    yield fig.axes[0]


def test_the_worker_ticks_read_as_integers(drawn):
    labels = [t.get_text() for t in drawn.get_xticklabels() if t.get_text()]
    assert labels == ["1", "2", "4"]


def test_the_choice_star_is_inside_the_axes(drawn):
    bottom, top = drawn.get_ylim()
    assert bottom == 0 and top >= 30.0 * 1.1  # room above the highest point, the choice's


def test_the_plateau_detail_states_the_choice_rule():
    ms = [
        Measurement(parallelism=Parallelism(0, t), batches_per_s=r, tokens_per_s=r, samples=2)
        for t, r in ((1, 10.0), (2, 20.0), (4, 20.2))
    ]
    tuning = policy.decide(ms, cpus=4)
    assert tuning.reason == "plateau" and tuning.parallelism.threads == 2
    # docs/spec.md: "within 2 %"; the gain itself as the table shows it.
    assert (
        f"gained 1.0% (in-proc x 4 thr: 20.2 batches/s), within the {policy.CHOICE_GAIN:.0%}"
        in (tuning.detail)
    )
    one = Tuning(parallelism=Parallelism(1, 1), reason="fastest", detail="", measurements=())
    assert one.summary().startswith("1 process x 1 thread (")


def test_bench_says_roughly_how_long_it_takes():
    from input_server.benchmark.estimate import estimate_s, minutes

    t = estimate_s(
        limit_tokens_per_s=1.8e6, kept=627_000, epochs=13, rounds=1, min_seconds=2.0, cores=2
    )
    # A timed --rounds 1 run on the 2-core host at 8 M tokens: about 3.5 minutes.
    assert 120 < t["total"] < 300 and minutes(t["total"]).endswith("min")
    five = estimate_s(
        limit_tokens_per_s=1.8e6, kept=627_000, epochs=13, rounds=5, min_seconds=2.0, cores=2
    )
    assert five["total"] == pytest.approx(t["total"] + 4 * t["round"])
