"""What no server can report: a pool member's running stream with one figure made impossible,
each way of making one and what the pool's view then says of it, and JSON read as strictly as
a strict parser reads it."""

from __future__ import annotations

import json

from input_client.proto import pb

# Each way a member's running stream can say what no server can (the figures given to
# `impossible_stream`), and the words the row then says of it.
IMPOSSIBLE = {
    "wait_share_infinite": (dict(share=float("inf")), "`client_wait_share` is inf"),
    "wait_share_over_one": (dict(share=7.5), "`client_wait_share` is 7.5, neither -1"),
    "wait_share_without_a_wait": (dict(wait_s=0.0), "`client_wait_share` is 0.9 with no wait"),
    "wait_negative": (dict(wait_s=-3.0), "`client_wait_s` is -3.0"),
    "production_nan": (dict(could=float("nan")), "`production_batches_per_s` is nan"),
    "pace_negative": (dict(taken=-4.0), "`consumed_batches_per_s` is -4.0, not a finite"),
    "pace_infinite": (dict(taken=float("inf")), "`consumed_batches_per_s` is inf"),
    "pace_with_nothing_sent": (dict(sent=0), "is 10.0 with no batch sent or taken"),
    "stage_seconds_negative": (dict(stage_s=-1.0), "`stages[read].seconds` is -1.0"),
    "count_negative": (dict(produced=-1), "`batches_produced` is -1"),
}


def impossible_stream(
    *,
    share: float = 0.9,
    wait_s: float = 9.0,
    taken: float = 10.0,
    could: float = 10.5,
    sent: int = 100,
    produced: int = 102,
    stage_s: float = 1.0,
) -> pb.StreamInfo:
    """Stream 7, input-bound, as `GetInfo` shows it: its client waited 90 % of its loop (so
    that, believed, it would limit the job), taking `taken` batches/s of the `could` it could
    make, `sent` batches sent and taken, `produced` made, `stage_s` seconds reading. Every
    figure is possible until one given makes it impossible (`IMPOSSIBLE`)."""
    s = pb.StreamInfo(
        stream_id=7,
        pipeline="p",
        batches_sent=sent,
        batches_produced=produced,
        batches_taken=sent,
        consumed_batches_per_s=taken,
        stats=pb.StreamStats(
            client_wait_share=share,
            client_wait_s=wait_s,
            production_batches_per_s=could,
            verdict_kind="input-bound",
            verdict="input-bound: because",
        ),
    )
    s.stats.stages.add(stage="read", seconds=stage_s)
    return s


def strict_json(text: str):
    """`text` parsed as strict JSON: NaN and Infinity refused, as strict parsers refuse them."""

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)
