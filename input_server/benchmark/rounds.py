"""`bench`'s rows, measured back to back in rounds: a row this host cannot run (loopback TCP where
the host refuses TCP, as TPU hosts do) is skipped saying why, and a row that fails is kept with
its error; either way the other rows go on and keep their figures."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from input_server.serving.listen import tcp_refused

Measure = Callable[[], dict]


def why_failed(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def unavailable(transports: Sequence[str]) -> dict[str, dict]:
    """The served rows this host cannot run, each as its result: `{"skipped": why}`."""
    refused = tcp_refused() if "tcp" in transports else None
    if not refused:
        return {}
    return {"tcp": {"skipped": f"{refused}; served over the Unix socket only"}}


def has_figures(row: dict) -> bool:
    """Whether a row's result holds a measured rate (not only why it has none)."""
    return "tokens_per_s" in row


@dataclasses.dataclass
class Rounds:
    """Each row's measurement a round (`samples`), in the order the rows ran; `missing` holds
    the rows that were skipped or failed, with why (a row that failed stops there, so the
    rounds it has are the first ones, aligned with the other rows')."""

    samples: dict[str, list[dict]]
    missing: dict[str, dict] = dataclasses.field(default_factory=dict)

    def once(self, name: str, measure: Measure, say) -> dict | None:
        """`measure()` as row `name`'s next sample, or None after recording why it failed."""
        try:
            figures = measure()
        except Exception as e:  # the row's failure is reported; the other rows keep theirs
            self.missing[name] = {"failed": why_failed(e)}
            say(f"{name}: failed ({why_failed(e)}); the other rows go on")
            return None
        self.samples.setdefault(name, []).append(figures)
        return figures

    def best(self, name: str) -> dict:
        """The fastest of the row's rounds (the others were slowed by whatever else ran),
        with every round's rate kept for the record; why it has none (or fewer) if missing."""
        samples = self.samples.get(name, [])
        if not samples:
            return dict(self.missing.get(name, {"failed": "not measured"}))
        best = max(samples, key=lambda r: r["tokens_per_s"])
        return {
            **best,
            "rounds_tokens_per_s": [r["tokens_per_s"] for r in samples],
            **self.missing.get(name, {}),
        }

    def ratios(self, pairs: dict[str, tuple[str, str]]) -> dict[str, list[float]]:
        """Each round's ratio `a / b` for each named pair, from measurements taken back to back
        in that round; a pair with a row without figures is left out."""
        rate = {k: [r["tokens_per_s"] for r in v] for k, v in self.samples.items()}
        out = {}
        for key, (a, b) in pairs.items():
            # The rounds both have: a row that failed stops, so its rounds are the first ones.
            both = list(zip(rate.get(a, []), rate.get(b, []), strict=False))
            if both:
                out[key] = [x / y if y else 0.0 for x, y in both]
        return out


def run_rounds(rows: dict[str, Measure], rounds: int, skip: dict[str, dict], say) -> Rounds:
    """Every row of `rows` back to back in each of `rounds` rounds, but those in `skip` (their
    result given) and those that failed in an earlier round."""
    done = Rounds(samples={name: [] for name in rows}, missing=dict(skip))
    for r in range(rounds):
        for name, measure in rows.items():
            if name not in done.missing:
                done.once(name, measure, say)
        figures = [
            f"{k} {v[-1]['tokens_per_s'] / 1e6:.2f}"
            for k, v in done.samples.items()
            if len(v) == r + 1
        ]
        say(f"round {r + 1}/{rounds}: " + ", ".join(figures) + " M tokens/s")
    return done


def medians(per_round: dict[str, list[float]]) -> dict[str, float]:
    """A ratio is the median of the rounds' own: a burst of load skews one round, not it."""
    return {k: float(np.median(v)) for k, v in per_round.items()}


def failures(result: dict) -> list[str]:
    """Every row of a `bench` result (or a `--kinds` one's) that failed, as `where: why`."""
    found = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            if "failed" in value and isinstance(value["failed"], str):
                found.append(f"{where}: {value['failed']}")
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))

    walk(result, "")
    return found
