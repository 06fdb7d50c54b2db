"""The one-line verdict on a stream: is its input the bottleneck, and if so which stage.

Read from a window of the stream's accounting (`Window`: what changed between two readings of
its stage seconds, its batches and its client's reports). The rules, in order (the first that
holds decides; docs/architecture.md, "Where a stream's time goes", says why each figure):

1. "starting": the window is shorter than MIN_WINDOW_S or holds fewer than MIN_BATCHES batches.
2. "delivery-bound": the trainer waited at least INPUT_BOUND_WAIT of its time while the stream
   spent at least CLIENT_BOUND_CREDIT of the window waiting for its credit: the batches were
   made and sent but had not reached the loop, so the network or the client's process (its
   CPU, decoding batches) is the bottleneck, not the pipeline.
3. "input-bound": the trainer waited at least INPUT_BOUND_WAIT of its time (its client
   reports its exposed wait): the input is the bottleneck; the largest worker stage is named,
   and what to do (more CPU, pool servers).
4. "client-bound": the stream spent at least CLIENT_BOUND_CREDIT of the window waiting for
   the client's credit while the trainer waited under FINE_WAIT (or its client does not say):
   the trainer, not the input, sets the pace; nothing to do here.
5. "tokenizer-bound" / "read-bound": one worker stage (tokenizing; reading with decompressing)
   takes at least STAGE_BOUND of the workers' time; ", fine" when the trainer waits under
   FINE_WAIT or production is at least FINE_HEADROOM x demand.
6. "balanced": none of the above.
"""

from __future__ import annotations

import dataclasses

MIN_WINDOW_S = 5.0
MIN_BATCHES = 10
INPUT_BOUND_WAIT = 0.05
FINE_WAIT = 0.01
CLIENT_BOUND_CREDIT = 0.30
STAGE_BOUND = 0.60  # of two shares, the larger is always at least half
FINE_HEADROOM = 1.2
# Where README sends an operator whose input is the bottleneck.
MORE_CPU = "add CPU or pool servers (deploy/README.md: Sizing a pool)"


@dataclasses.dataclass(frozen=True)
class Window:
    """What a stream did over `seconds` (differences of two readings).

    Attributes:
      stages: seconds in each stage (`input_server.stages.STAGES`) over the window.
      batches: batches produced in the window.
      wait_share: the trainer's exposed wait over its loop's time, 0..1; None when its client
        does not report it.
      production: batches/s the stream could make (its batches over the time its producer was
        not waiting for room); demand: the loop's pace, batches/s (0: unknown).
      processes, threads, max_workers: its parallelism now, and the most processes it may use.
      tokenizer: the tokenizer's kind, as the verdict names it.
    """

    seconds: float
    stages: dict[str, float]
    batches: int
    wait_share: float | None
    production: float
    demand: float
    processes: int
    threads: int
    max_workers: int
    tokenizer: str


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %" if share >= 0.01 or share == 0 else f"{100 * share:.1f} %"


def _worker_shares(w: Window) -> dict[str, float]:
    """Tokenizing and reading (decompressing included) as shares of the workers' time."""
    busy = w.stages["read"] + w.stages["decompress"] + w.stages["tokenize"]
    if busy <= 0:
        return {"tokenize": 0.0, "read": 0.0}
    return {
        "tokenize": w.stages["tokenize"] / busy,
        "read": (w.stages["read"] + w.stages["decompress"]) / busy,
    }


def _headroom(w: Window) -> str:
    """ "production 2.1 x demand", or "" when the demand is unknown."""
    if w.demand <= 0 or w.production <= 0:
        return ""
    return f"production {w.production / w.demand:.1f} x demand"


def _waited(w: Window) -> str:
    if w.wait_share is None:
        return "its client does not report the trainer's wait"
    return f"the trainer waited {_pct(w.wait_share)}"


def _largest_stage(w: Window) -> str:
    shares = _worker_shares(w)
    stage = max(shares, key=shares.get)
    what = f"in {w.tokenizer}" if stage == "tokenize" else "reading records"
    return f"{_pct(shares[stage])} of worker time {what}"


def verdict(w: Window) -> tuple[str, str]:
    """(kind, the one-line verdict) of a stream's window (the module's rules)."""
    if w.seconds < MIN_WINDOW_S or w.batches < MIN_BATCHES:
        return "starting", f"starting: {w.batches} batches in {w.seconds:.0f} s; a verdict soon"
    # A wait is counted as it ends, so a long one can land in one window whole: capped at 1.
    credit = min(1.0, w.stages["credit_wait"] / w.seconds)
    waits = w.wait_share is not None and w.wait_share >= INPUT_BOUND_WAIT
    if waits and credit >= CLIENT_BOUND_CREDIT:
        return "delivery-bound", (
            f"delivery-bound: {_waited(w)} of its time while the stream waited {_pct(credit)} "
            "for its credit, its batches sent — the network or the client's process (its CPU, "
            "decoding batches) is the bottleneck, not the input pipeline"
        )
    if waits:
        at = f"{w.processes} processes x {w.threads} threads (--max-workers {w.max_workers})"
        parts = [f"input-bound: {_waited(w)} of its time", _headroom(w), f"at {at}"]
        line = "; ".join(p for p in parts if p)
        return "input-bound", f"{line}; {_largest_stage(w)} — {MORE_CPU}"
    if credit >= CLIENT_BOUND_CREDIT and (w.wait_share is None or w.wait_share < FINE_WAIT):
        return "client-bound", (
            f"client-bound: {_pct(credit)} of the time waiting for credit while {_waited(w)}"
            " — the trainer is the bottleneck, nothing to do here"
        )
    fine = (w.wait_share is not None and w.wait_share < FINE_WAIT) or (
        w.demand > 0 and w.production >= FINE_HEADROOM * w.demand
    )
    tail = "; ".join(p for p in (_headroom(w), _waited(w)) if p)
    shares = _worker_shares(w)
    for stage, kind in (("tokenize", "tokenizer-bound"), ("read", "read-bound")):
        if shares[stage] >= STAGE_BOUND:
            head = f"{kind}, fine" if fine else kind
            return kind, f"{head}: {_largest_stage(w)}; {tail}"
    lead = f"neither tokenizing nor reading takes {_pct(STAGE_BOUND)} of the worker time"
    return "balanced", f"balanced: {lead}; {tail}"
