"""`input-server stats`: where each stream's time goes and the one-line verdict on it, once or
(`--watch`) every few seconds; `--json` for machines (one object a reading, strict JSON: a figure
that is not a finite number is null). Several servers are a pool's view (`pool_stats`)."""

from __future__ import annotations

import argparse
import sys
import time

from input_server.cli import strict_json
from input_server.cli.arguments import positive
from input_server.cli.connection import (
    BadAddresses,
    Unreachable,
    add_connection_arguments,
    addresses_of,
    connected_to,
)
from input_server.cli.info import audit_words
from input_server.cli.pool_stats import run_pool
from input_server.plurals import plural
from input_server.quoting import quote, quoted_copy
from input_server.stages import STREAM_STAGES, WORKER_STAGES


def _seconds(stats) -> dict[str, float]:
    return {t.stage: t.seconds for t in stats.stages}


def _shares(seconds: dict[str, float], stages: tuple[str, ...], total: float) -> str:
    if total <= 0:
        return "-"
    return "  ".join(f"{s} {100 * seconds.get(s, 0.0) / total:.0f} %" for s in stages)


def _si(x: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} "


def _delta(now, before):
    """The stream's figures since `before` (an earlier reading of it), or since it opened."""
    seconds = _seconds(now.stats)
    span = now.stats.age_s
    real, padding, sent = now.stats.real_tokens, now.stats.padding_tokens, now.stats.bytes_sent
    if before is not None:
        old = _seconds(before.stats)
        seconds = {s: v - old.get(s, 0.0) for s, v in seconds.items()}
        span = now.stats.age_s - before.stats.age_s
        real -= before.stats.real_tokens
        padding -= before.stats.padding_tokens
        sent -= before.stats.bytes_sent
    return seconds, max(span, 1e-9), real, padding, sent


def format_stream(s, before=None) -> list[str]:
    """A person's view of one stream: verdict, rates, each stage's share, queue, the trainer."""
    st = s.stats
    seconds, span, real, padding, sent = _delta(s, before)
    worker = sum(seconds.get(x, 0.0) for x in WORKER_STAGES)
    total = real + padding
    pad = f" ({100 * padding / total:.0f} % padding)" if total else ""
    waited = (
        "its client does not report its wait"
        if st.client_wait_s < 0
        else f"waited {100 * st.client_wait_share:.1f} % of its loop ({st.client_wait_s:.1f} s)"
    )
    return [
        f"stream {s.stream_id}  {s.pipeline}  {plural(s.worker_processes, 'process', 'processes')}"
        f" x {plural(s.worker_threads, 'thread')} ({s.worker_reason})",
        f"  verdict   {st.verdict}",
        f"  rates     taken {s.consumed_batches_per_s:.1f} batches/s, could make "
        f"{st.production_batches_per_s:.1f}; {_si(real / span)}tokens/s{pad}, "
        f"{_si(sent / span)}B/s",
        f"  workers   {_shares(seconds, WORKER_STAGES, worker)}  (of {worker:.1f} s)",
        f"  stream    {_shares(seconds, STREAM_STAGES, span)}  (of {span:.1f} s)",
        f"  queue     {st.queue_fill} of {st.queue_depth} batches ready",
        f"  trainer   {waited}",
        *([f"  audits    {audit_words(s)}"] if s.backend_groups else []),
    ]


def format_stats(info, address: str, before=None) -> str:
    """Every stream's view (`format_stream`), since `before` (an earlier GetInfoResponse);
    every string quoted (`input_server.quoting`)."""
    info, address = quoted_copy(info), quote(address)
    earlier = {s.stream_id: s for s in before.streams} if before is not None else {}
    running = [s for s in info.streams if s.HasField("stats")]
    lines = [f"server {address}: {plural(len(running), 'stream')} running"]
    for s in running:
        lines.extend(format_stream(s, earlier.get(s.stream_id)))
    return "\n".join(lines)


def stream_dicts(info) -> list[dict]:
    """Each running stream's figures and verdict, as `--json` gives them."""
    return [
        {
            "stream_id": s.stream_id,
            "pipeline": s.pipeline,
            "worker_processes": s.worker_processes,
            "worker_threads": s.worker_threads,
            "worker_reason": s.worker_reason,
            "consumed_batches_per_s": s.consumed_batches_per_s,
            "stats": strict_json.message_dict(s.stats),
        }
        for s in info.streams
        if s.HasField("stats")
    ]


def as_json(info) -> str:
    """One line of strict JSON: each running stream's figures and verdict, and the server's
    totals; a figure the server sent that is not a finite number is null."""
    streams = stream_dicts(info)
    totals = strict_json.message_dict(info.totals)
    return strict_json.dumps({"at": time.time(), "streams": streams, "totals": totals})


def register(subparsers) -> None:
    stats = subparsers.add_parser(
        "stats",
        help="where each stream's time goes, and whether input is the bottleneck",
        description="One server: each stream's verdict and where its time goes. Several (a "
        "pool, or a fan-in's list): a row a server and one verdict for the job, naming the "
        "server that limits it.",
    )
    add_connection_arguments(stats, positive=positive(float), several=True)
    stats.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a reading (strict JSON: a figure a server sent that is not a "
        "finite number is null)",
    )
    stats.add_argument(
        "--watch", action="store_true", help="read again every --interval-s, until Ctrl-C"
    )
    stats.add_argument("--interval-s", type=positive(float), default=5.0)
    stats.add_argument(
        "--count", type=int, default=0, help="with --watch: stop after COUNT readings"
    )


def run(args: argparse.Namespace) -> int:
    try:
        addresses = addresses_of(args)
    except BadAddresses as e:
        print(f"input-server: {quote(e)}", file=sys.stderr)
        return 2
    if len(addresses) > 1:
        return run_pool(args, addresses, stream_dicts)
    readings = (args.count if args.count > 0 else None) if args.watch else 1
    before, done = None, 0
    try:
        with connected_to(args, addresses[0] if addresses else None) as (client, address):
            while readings is None or done < readings:
                if done:
                    time.sleep(args.interval_s)
                info = client.info()
                print(as_json(info) if args.json else format_stats(info, address, before))
                sys.stdout.flush()
                before, done = info, done + 1
    except Unreachable as e:
        print(quote(e), file=sys.stderr)  # it may repeat what a server sent
        return 2
    except KeyboardInterrupt:  # --watch ends with Ctrl-C
        return 0
    return 0
