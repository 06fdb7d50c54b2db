"""The trial's phases and verdict (`data.tokenizers.speed.Trial`) on timed groups given to it:
the backend's phase, then the reference's, which ends early when one side is decisively
faster."""

from __future__ import annotations

import pytest

from input_server.data.tokenizers import speed


def _run(
    trial: speed.Trial, ns: dict[str, float], tokens: int = 10_000, most: int = 1_000
) -> list[str]:
    """Encodes groups as `trial.side()` hands them out, each taking `ns[side]` a token, until
    the verdict, the phases run out or `most` groups; the sides in the order handed out."""
    sides = []
    while trial.verdict is None and len(sides) < most and (turn := trial.side()) is not None:
        side, timed = turn
        sides.append(side)
        if timed:
            trial.record(side, ns[side] * tokens / 1e9, tokens)
    return sides


@pytest.mark.parametrize(("backend_ns", "serves"), [(30, True), (3_000, False)])
def test_a_decisive_side_ends_the_reference_phase_after_a_few_groups(backend_ns, serves):
    trial = speed.Trial("fastokens")
    sides = _run(trial, {"backend": backend_ns, "reference": 1_000})
    assert sides.count("backend") == speed.PHASE_GROUPS
    assert sides.count("reference") == speed.WARM_GROUPS + speed.EARLY_GROUPS
    v = trial.verdict
    assert (v.serves, v.groups, v.reference_groups) == (serves, 16, speed.EARLY_GROUPS)
    assert f"16 groups and {speed.EARLY_GROUPS})" in v.said()


def test_a_close_race_runs_the_whole_reference_phase():
    trial = speed.Trial("kitoken")
    sides = _run(trial, {"backend": 800, "reference": 1_000})
    assert sides.count("reference") == speed.PHASE_GROUPS
    v = trial.verdict
    assert v.serves and v.reference_groups == speed.MEASURED_GROUPS
    assert "16 groups each)" in v.said()


def test_too_few_tokens_to_time_start_the_phases_again():
    trial = speed.Trial("fastokens")
    sides = _run(trial, {"backend": 30, "reference": 1_000}, tokens=100, most=3 * 24)
    assert trial.verdict is None and len(sides) == 3 * 24
