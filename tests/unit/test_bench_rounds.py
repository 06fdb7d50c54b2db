"""`bench`'s rounds: a row that fails or cannot run keeps its place with why, and the other rows
keep every figure they measured; the table and the CLI's exit say so."""

from __future__ import annotations

import itertools

from input_server.benchmark.rounds import failures, medians, run_rounds, unavailable
from input_server.benchmark.table import format_table


def _rate(tokens_per_s: float) -> dict:
    return {"tokens": 1000, "seconds": 1000 / tokens_per_s, "tokens_per_s": tokens_per_s}


def test_a_row_that_fails_keeps_its_rounds_and_the_others_theirs():
    said = []
    calls = itertools.count(1)

    def flaky() -> dict:  # measures in the first round, fails in the second
        if next(calls) > 1:
            raise ConnectionError("the server went away\nsecond line")
        return _rate(400.0)

    rows = {"limit": lambda: _rate(1000.0), "ours": lambda: _rate(500.0), "unix": flaky}
    done = run_rounds(rows, 3, {}, said.append)
    assert [len(done.samples[k]) for k in rows] == [3, 3, 1]
    assert done.missing == {"unix": {"failed": "ConnectionError: the server went away"}}
    unix = done.best("unix")
    assert unix["tokens_per_s"] == 400.0 and unix["failed"].startswith("ConnectionError")
    assert done.best("ours")["rounds_tokens_per_s"] == [500.0] * 3
    ratios = done.ratios({"ours/limit": ("ours", "limit"), "unix/ours": ("unix", "ours")})
    assert ratios == {"ours/limit": [0.5] * 3, "unix/ours": [0.8]}  # the rounds both have
    assert medians(ratios) == {"ours/limit": 0.5, "unix/ours": 0.8}
    assert "unix: failed (ConnectionError: the server went away); the other rows go on" in said
    assert said[-1] == "round 3/3: limit 0.00, ours 0.00 M tokens/s"


def test_a_skipped_row_is_never_run_and_says_why():
    ran = []
    skip = {"tcp": {"skipped": "no TCP here"}}
    done = run_rounds({"ours": lambda: _rate(1.0), "tcp": lambda: ran.append(1)}, 2, skip, print)
    assert not ran and done.best("tcp") == {"skipped": "no TCP here"}
    assert done.ratios({"tcp/ours": ("tcp", "ours")}) == {}


def test_tcp_is_skipped_only_where_the_host_refuses_it():
    assert unavailable(("unix",)) == {}
    assert unavailable(("unix", "tcp")) == {}  # this host makes TCP sockets


def test_the_table_shows_why_a_row_has_no_figures_and_failures_are_listed():
    result = {
        "kind": "sentencepiece",
        "limit": {**_rate(2e6), "call": "encode"},
        "reference": {"0": {"failed": "RuntimeError: grain broke", "processes": 0}},
        "reference_encode": "per document",
        "pipeline_in_process": _rate(1e6),
        "server": {"unix": {"failed": "StreamError: gone"}, "tcp": {"skipped": "no TCP"}},
        "ratios": {"in_process_over_limit": 0.5},
    }
    lines = format_table(result).splitlines()
    assert any(
        line.startswith("MaxText-style reference, 0 processes")
        and line.endswith("failed: RuntimeError: grain broke")
        for line in lines
    )
    assert any(line.endswith("skipped: no TCP") for line in lines)
    assert not any("wire bytes" in line for line in lines)  # no served row has figures
    assert failures(result) == [
        "reference.0: RuntimeError: grain broke",
        "server.unix: StreamError: gone",
    ]
