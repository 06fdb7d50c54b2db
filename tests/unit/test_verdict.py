"""The verdict's rules on synthetic windows: each kind where its rule holds, and the rule's
order (the first that holds decides)."""

from __future__ import annotations

import pytest

from input_server.serving import verdict as v
from input_server.stages import STAGES


def window(*, seconds=30.0, batches=300, wait=None, production=20.0, demand=10.0, **stages):
    s = dict.fromkeys(STAGES, 0.0)
    s.update(stages)
    return v.Window(
        seconds=seconds,
        stages=s,
        batches=batches,
        wait_share=wait,
        production=production,
        demand=demand,
        processes=2,
        threads=4,
        max_workers=8,
        tokenizer="tiktoken",
    )


def test_a_short_window_or_few_batches_is_starting():
    assert v.verdict(window(seconds=2.0, tokenize=10.0))[0] == "starting"
    assert v.verdict(window(batches=3, tokenize=10.0))[0] == "starting"


def test_a_waiting_trainer_is_input_bound_and_told_what_to_do():
    kind, line = v.verdict(window(wait=0.12, production=8.0, demand=10.0, tokenize=45, read=5))
    assert kind == "input-bound"
    assert line.startswith("input-bound: the trainer waited 12 % of its time")
    assert "production 0.8 x demand" in line
    assert "2 processes x 4 threads (--max-workers 8)" in line
    assert "90 % of worker time in tiktoken" in line
    assert "Sizing a pool" in line


def test_input_bound_wins_over_every_stage_rule():
    # The trainer waits and the server does not wait on it: the input is the bottleneck.
    assert v.verdict(window(wait=0.05, credit_wait=8.0, read=40))[0] == "input-bound"
    assert v.verdict(window(wait=0.049, read=40))[0] == "read-bound"


def test_a_trainer_that_waits_while_the_server_waits_for_its_credit_is_delivery_bound():
    # Batches made and sent, not yet at the loop: between the two is the bottleneck.
    kind, line = v.verdict(window(wait=0.58, credit_wait=17.1, tokenize=45, read=5))
    assert kind == "delivery-bound"
    assert line.startswith("delivery-bound: the trainer waited 58 % of its time")
    assert "waited 57 % for its credit" in line and "not the input pipeline" in line
    assert v.verdict(window(wait=0.58, credit_wait=8.9, tokenize=45))[0] == "input-bound"
    assert v.verdict(window(wait=0.005, credit_wait=17.1))[0] == "client-bound"


def test_waiting_for_credit_while_the_trainer_does_not_wait_is_client_bound():
    kind, line = v.verdict(window(wait=0.0, credit_wait=12.0, tokenize=10))
    assert kind == "client-bound"
    assert line.startswith("client-bound: 40 % of the time waiting for credit")
    assert "the trainer waited 0 %" in line and "nothing to do here" in line
    # A client that does not report its wait: the credit alone says it.
    kind, line = v.verdict(window(credit_wait=12.0))
    assert kind == "client-bound" and "does not report" in line
    # Under the threshold, or with a trainer that waits a little: not client-bound.
    assert v.verdict(window(wait=0.0, credit_wait=8.0, tokenize=10))[0] == "tokenizer-bound"
    assert v.verdict(window(wait=0.02, credit_wait=12.0, tokenize=10))[0] == "tokenizer-bound"


@pytest.mark.parametrize(
    ("stages", "kind", "needle"),
    [
        ({"tokenize": 81, "read": 19}, "tokenizer-bound", "81 % of worker time in tiktoken"),
        (
            {"read": 50, "decompress": 20, "tokenize": 30},
            "read-bound",
            "70 % of worker time reading",
        ),
        ({"read": 40, "decompress": 15, "tokenize": 45}, "balanced", "neither tokenizing"),
    ],
)
def test_the_largest_worker_stage_names_the_bound(stages, kind, needle):
    got, line = v.verdict(window(wait=0.003, **stages))
    assert got == kind and needle in line, line
    assert "the trainer waited 0.3 %" in line


def test_fine_when_the_trainer_does_not_wait_or_production_has_headroom():
    assert "tokenizer-bound, fine:" in v.verdict(window(wait=0.003, tokenize=9))[1]
    # Wait unknown: headroom decides.
    assert "tokenizer-bound, fine:" in v.verdict(window(production=13, demand=10, tokenize=9))[1]
    line = v.verdict(window(production=11, demand=10, tokenize=9))[1]
    assert line.startswith("tokenizer-bound: ") and "production 1.1 x demand" in line
    # Neither known: never called fine.
    assert v.verdict(window(demand=0.0, tokenize=9))[1].startswith("tokenizer-bound: ")
