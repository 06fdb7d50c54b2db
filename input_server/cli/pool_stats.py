"""`input-server stats` across a pool: several servers read at once, a row each, and one
verdict for the job naming the server that limits it.

A pod trains in lock step, so the job goes at the pace of its slowest input: the server whose
clients wait most. The rule (`limiting`) is the per-stream verdict's (`serving/verdict.py`)
lifted a level: a stream whose trainer waited at least INPUT_BOUND_WAIT of its time is
input-bound; the server (and the job) is judged by its stream (server) under most pressure:
1. the one whose clients waited most, among those that waited at least INPUT_BOUND_WAIT;
2. else the one with the least production headroom (could make / taken), the nearest to
   limiting it;
3. else (no demand known yet) the one whose clients waited most, a reported wait before none.
Its verdict kind is the server's, and the job's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from input_server.cli.connection import Unreachable, connected_to
from input_server.plurals import plural
from input_server.quoting import quote, quoted_copy
from input_server.serving.verdict import INPUT_BOUND_WAIT

# The most servers asked at once: each waits on the network, not on this process's CPU.
MAX_THREADS = 32


def pressure(wait_share: float | None, headroom: float | None) -> tuple:
    """What orders streams and servers by how near they are to limiting the job (the module's
    rules): the largest is the limiting one."""
    waiting = wait_share is not None and wait_share >= INPUT_BOUND_WAIT
    return (
        waiting,
        wait_share if waiting else 0.0,
        headroom is not None,
        -headroom if headroom is not None else 0.0,
        -1.0 if wait_share is None else wait_share,
    )


def _stream_wait(s) -> float | None:
    return s.stats.client_wait_share if s.stats.client_wait_share >= 0 else None


def _stream_headroom(s) -> float | None:
    taken, could = s.consumed_batches_per_s, s.stats.production_batches_per_s
    return could / taken if taken > 0 and could > 0 else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerRow:
    """One server's line of the pool's table.

    Attributes:
      address: its address, quoted.
      error: why it could not be asked (quoted), or None.
      streams: its running streams.
      taken, could_make: batches/s its clients take and its streams could make, summed.
      wait_share: the largest share of its loop's time a client of it waited (None: no client
        reports it).
      headroom: its limiting stream's production / demand (None: not known); with no client
        waiting, the least of its streams'.
      kind, verdict: its limiting stream's verdict kind and sentence ("idle" with no stream,
        "unreachable" when it could not be asked).
      stream_id: its limiting stream (None without one).
    """

    address: str
    error: str | None = None
    streams: int = 0
    taken: float = 0.0
    could_make: float = 0.0
    wait_share: float | None = None
    headroom: float | None = None
    kind: str = "idle"
    verdict: str = "idle: no stream running"
    stream_id: int | None = None

    @classmethod
    def of(cls, address: str, info) -> ServerRow:
        """The row of a server's `GetInfoResponse` (its strings quoted here)."""
        info = quoted_copy(info)
        running = [s for s in info.streams if s.HasField("stats")]
        if not running:
            return cls(address=quote(address))
        waits = [w for w in map(_stream_wait, running) if w is not None]
        worst = max(running, key=lambda s: pressure(_stream_wait(s), _stream_headroom(s)))
        return cls(
            address=quote(address),
            streams=len(running),
            taken=sum(s.consumed_batches_per_s for s in running),
            could_make=sum(s.stats.production_batches_per_s for s in running),
            wait_share=max(waits) if waits else None,
            headroom=_stream_headroom(worst),
            kind=worst.stats.verdict_kind or "starting",
            verdict=f"stream {worst.stream_id}: {worst.stats.verdict}",
            stream_id=worst.stream_id,
        )

    @classmethod
    def unreachable(cls, address: str, error: str) -> ServerRow:
        return cls(
            address=quote(address),
            error=quote(error),
            kind="unreachable",
            verdict=f"unreachable: {quote(error)}",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobVerdict:
    """The job's verdict over its servers' rows.

    Attributes:
      kind: the limiting server's verdict kind; "idle" when no server answered with a stream,
        "unreachable" when none answered at all.
      verdict: the sentence: the server that limits the job, why, and its own verdict.
      limiting: the address of the server that limits the job, or, where no server's clients
        wait, of the one nearest to limiting it (None without one).
      unreachable: the servers that could not be asked: the job's view leaves them out.
    """

    kind: str
    verdict: str
    limiting: str | None
    unreachable: tuple[str, ...]

    @property
    def partial(self) -> bool:
        return bool(self.unreachable)


def _pct(share: float) -> str:
    return f"{100 * share:.1f} %"


def _why(row: ServerRow, rows: int) -> str:
    """Why `row` limits the job, in the words of the rule that chose it (`rows`: the servers
    with streams it was chosen from)."""
    among = f" of the {rows} servers with streams" if rows > 1 else ""
    fine = f"no server's clients waited {_pct(INPUT_BOUND_WAIT)} of their time"
    if row.wait_share is not None and row.wait_share >= INPUT_BOUND_WAIT:
        head = f"its clients waited {_pct(row.wait_share)} of their time, the most{among}"
    elif row.headroom is not None:
        head = f"{fine}; its production headroom is the least{among}"
    else:
        head = f"{fine}, and none knows its demand yet"
    if row.headroom is None:
        return head
    return f"{head}: production {row.headroom:.1f} x demand"


def limiting(rows: Sequence[ServerRow]) -> JobVerdict:
    """The job's verdict: the server under most pressure (the module's rules) among those that
    answered with a stream, named with its verdict; the servers that could not be asked."""
    lost = tuple(r.address for r in rows if r.error is not None)
    partial = (
        f" — partial: {len(lost)} of {len(rows)} servers could not be asked ({', '.join(lost)})"
        if lost
        else ""
    )
    serving = [r for r in rows if r.error is None and r.streams]
    if not serving:
        if len(lost) == len(rows):
            said = f"none of the {len(rows)} servers could be asked"
            return JobVerdict(
                kind="unreachable", verdict=f"unreachable: {said}", limiting=None, unreachable=lost
            )
        verdict = f"idle: no stream running{partial}"
        return JobVerdict(kind="idle", verdict=verdict, limiting=None, unreachable=lost)
    row = max(serving, key=lambda r: pressure(r.wait_share, r.headroom))
    waiting = row.wait_share is not None and row.wait_share >= INPUT_BOUND_WAIT
    # Only a server whose clients wait limits the job; else it is the nearest to limiting it.
    named = (
        f"{row.address} limits the job"
        if waiting
        else f"no server limits the job; nearest to it: {row.address}"
    )
    verdict = f"{row.kind}: {named} ({_why(row, len(serving))}) — {row.verdict}{partial}"
    return JobVerdict(kind=row.kind, verdict=verdict, limiting=row.address, unreachable=lost)


def ask_all(args: argparse.Namespace, addresses: Sequence[str]) -> list[tuple[str, Any]]:
    """Each server's `GetInfoResponse`, asked at once with `args`'s credentials and timeout, or
    the line saying why it could not be asked: (address, info or the line), in order."""

    def ask(address: str) -> Any:
        try:
            with connected_to(args, address) as (client, _):
                return client.info()
        except Unreachable as e:
            return str(e).removeprefix("input-server: ")

    threads = min(MAX_THREADS, len(addresses))
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="stats") as pool:
        return list(zip(addresses, pool.map(ask, addresses), strict=True))


def rows_of(answers: Sequence[tuple[str, Any]]) -> list[ServerRow]:
    return [
        ServerRow.unreachable(a, info) if isinstance(info, str) else ServerRow.of(a, info)
        for a, info in answers
    ]


def _rate(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def format_pool(rows: Sequence[ServerRow], job: JobVerdict) -> str:
    """The pool's table, a row a server, then the job's verdict and why any server is out."""
    head = ("server", "streams", "taken b/s", "could make b/s", "clients waited", "verdict")
    table = [head]
    for r in rows:
        if r.error is not None:
            table.append((r.address, "-", "-", "-", "-", r.kind))
            continue
        waited = "not reported" if r.wait_share is None else _pct(r.wait_share)
        if not r.streams:
            waited = "-"
        table.append(
            (r.address, str(r.streams), _rate(r.taken), _rate(r.could_make), waited, r.kind)
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]

    def line(cells) -> str:
        first = cells[0].ljust(widths[0])
        middle = [c.rjust(w) for c, w in zip(cells[1:-1], widths[1:-1], strict=True)]
        return "  ".join([first, *middle, cells[-1]])

    answered = sum(r.error is None for r in rows)
    streams = sum(r.streams for r in rows)
    running = plural(streams, "stream")
    lines = [f"pool of {len(rows)} servers: {answered} answered, {running} running"]
    lines += [line(cells) for cells in table]
    lines.append(f"job  {job.verdict}")
    lines += [f"  {r.address}: {r.error}" for r in rows if r.error is not None]
    return "\n".join(lines)


def as_json(
    answers: Sequence[tuple[str, Any]],
    rows: Sequence[ServerRow],
    job: JobVerdict,
    streams_json: Callable[[Any], list[dict]],
) -> str:
    """One line: each server's row and streams (`streams_json` of its info), and the job's
    verdict."""
    servers = []
    for (_, info), r in zip(answers, rows, strict=True):
        row = dataclasses.asdict(r)
        row["streams_running"] = row.pop("streams")
        row["streams"] = [] if isinstance(info, str) else streams_json(info)
        servers.append(row)
    verdict = {
        "kind": job.kind,
        "verdict": job.verdict,
        "limiting": job.limiting,
        "partial": job.partial,
        "unreachable": list(job.unreachable),
    }
    return json.dumps({"at": time.time(), "servers": servers, "job": verdict})


def run_pool(
    args: argparse.Namespace,
    addresses: Sequence[str],
    streams_json: Callable[[Any], list[dict]],
) -> int:
    """`stats` of several servers, once or `--watch`: 0, or 2 when the last reading could not
    ask every server. `streams_json`: a server's streams as one server's `--json` gives them
    (`stats.stream_dicts`: passed in, as `stats` is the command that dispatches here)."""
    readings = (args.count if args.count > 0 else None) if args.watch else 1
    done, code = 0, 0
    try:
        while readings is None or done < readings:
            if done:
                time.sleep(args.interval_s)
            answers = ask_all(args, addresses)
            rows = rows_of(answers)
            job = limiting(rows)
            text = (
                as_json(answers, rows, job, streams_json) if args.json else format_pool(rows, job)
            )
            print(text)
            sys.stdout.flush()
            done, code = done + 1, 2 if job.partial else 0
    except KeyboardInterrupt:  # --watch ends with Ctrl-C
        return 0
    return code
