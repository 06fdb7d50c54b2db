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

A server's figures are checked before it may speak for the job (`impossible`): one that reports
what no server can (a figure that is not a finite number, a negative rate, time or count, a wait
share outside [0, 1], a pace of batches taken with none sent or taken) is named as reporting
impossible figures and left out of the job's view, as one that cannot be asked is; it never
limits the job.
`--json` is strict JSON: a figure that is not a finite number is null.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from input_server.cli import strict_json
from input_server.cli.connection import Unreachable, connected_to
from input_server.plurals import plural
from input_server.quoting import quote, quoted_copy
from input_server.serving.verdict import INPUT_BOUND_WAIT

# The most servers asked at once: each waits on the network, not on this process's CPU.
MAX_THREADS = 32


# A running stream's figures that are rates, times or counts: each a finite number >= 0, by where
# it sits in the answer (the stream's own fields, or its `stats`).
_STREAM_FIGURES = (
    "consumed_batches_per_s",
    "demand_batches_per_s",
    "batches_sent",
    "batches_produced",
    "batches_taken",
)
_STATS_FIGURES = (
    "age_s",
    "production_batches_per_s",
    "real_tokens",
    "padding_tokens",
    "bytes_sent",
    "queue_fill",
    "queue_depth",
)


def _bad(value: float, top: float) -> bool:
    """Neither -1 (not reported) nor a finite number within [0, `top`]; NaN fails every
    comparison, so it is bad too."""
    return not (math.isfinite(value) and (value == -1 or 0 <= value <= top))


def impossible(s) -> str | None:
    """What no server can truly report in a running stream's figures (the first found), or None.

    Figures cannot be checked against the truth, only against what they mean and each other:
    each rate, time and count a finite number >= 0; the client's wait -1 (not reported) or a
    finite number of seconds >= 0, its share of the loop's time -1 or within [0, 1], a share
    above 0 only with some wait behind it; a pace of batches taken only once a batch was sent or
    taken. The rules between two figures leave room for a live stream's counters moving while
    the server reads one and then the other (a pace needs two batches sent, and the rule asks
    for one), so a real server's answer is never impossible.
    """
    st = s.stats
    figures = [(n, getattr(s, n)) for n in _STREAM_FIGURES]
    figures += [(n, getattr(st, n)) for n in _STATS_FIGURES]
    figures += [(f"stages[{t.stage}].seconds", t.seconds) for t in st.stages]
    for name, value in figures:
        if not math.isfinite(value) or value < 0:
            return f"`{name}` is {value!r}, not a finite number >= 0"
    wait, share = st.client_wait_s, st.client_wait_share
    if _bad(wait, math.inf):
        return f"`client_wait_s` is {wait!r}, neither -1 (not reported) nor seconds >= 0"
    if _bad(share, 1.0):
        return f"`client_wait_share` is {share!r}, neither -1 (not reported) nor within [0, 1]"
    if share > 0 and wait <= 0:
        return f"`client_wait_share` is {share!r} with no wait behind it (`client_wait_s` {wait!r})"
    if s.consumed_batches_per_s > 0 and s.batches_sent == 0 and s.batches_taken == 0:
        return (
            f"`consumed_batches_per_s` is {s.consumed_batches_per_s!r} with no batch sent or taken"
        )
    return None


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
        "unreachable" when it could not be asked, "bad-figures" when its figures are
        impossible).
      stream_id: its limiting stream (None without one).
      bad_figures: what no server can truly report that it did (`impossible`: the first found,
        with its stream), or None; its figures then stay out of the row and the job's view.
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
    bad_figures: str | None = None

    @classmethod
    def of(cls, address: str, info) -> ServerRow:
        """The row of a server's `GetInfoResponse` (its strings quoted here)."""
        info = quoted_copy(info)
        running = [s for s in info.streams if s.HasField("stats")]
        if not running:
            return cls(address=quote(address))
        for s in running:
            why = impossible(s)
            if why is not None:
                why = f"stream {s.stream_id}: {why}"
                return cls(
                    address=quote(address),
                    streams=len(running),
                    kind="bad-figures",
                    verdict=f"bad-figures: {why}",
                    bad_figures=why,
                )
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
      bad_figures: the servers that reported impossible figures: left out too.
    """

    kind: str
    verdict: str
    limiting: str | None
    unreachable: tuple[str, ...]
    bad_figures: tuple[str, ...] = ()

    @property
    def partial(self) -> bool:
        """Whether the job's view leaves a server out."""
        return bool(self.unreachable or self.bad_figures)


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


def _partial(servers: int, lost: Sequence[str], bad: Sequence[str]) -> str:
    """The verdict's ending that names the servers the job's view leaves out, if any."""
    said = []
    if lost:
        said.append(f"{len(lost)} of {servers} servers could not be asked ({', '.join(lost)})")
    if bad:
        said.append(
            f"{len(bad)} of {servers} servers reported impossible figures ({', '.join(bad)})"
        )
    return f" — partial: {'; '.join(said)}" if said else ""


def limiting(rows: Sequence[ServerRow]) -> JobVerdict:
    """The job's verdict: the server under most pressure (the module's rules) among those that
    answered with a stream and figures that can be true, named with its verdict; the servers
    that could not be asked, and those whose figures are impossible."""
    lost = tuple(r.address for r in rows if r.error is not None)
    bad = tuple(r.address for r in rows if r.bad_figures is not None)
    partial = _partial(len(rows), lost, bad)
    out = {"unreachable": lost, "bad_figures": bad}
    serving = [r for r in rows if r.error is None and r.bad_figures is None and r.streams]
    if not serving:
        if len(lost) == len(rows):
            said = f"none of the {len(rows)} servers could be asked"
            return JobVerdict(
                kind="unreachable", verdict=f"unreachable: {said}", limiting=None, **out
            )
        if len(lost) + len(bad) == len(rows):
            said = f"no server answered with figures that can be true{partial}"
            return JobVerdict(
                kind="bad-figures", verdict=f"bad-figures: {said}", limiting=None, **out
            )
        verdict = f"idle: no stream running{partial}"
        return JobVerdict(kind="idle", verdict=verdict, limiting=None, **out)
    row = max(serving, key=lambda r: pressure(r.wait_share, r.headroom))
    waiting = row.wait_share is not None and row.wait_share >= INPUT_BOUND_WAIT
    # Only a server whose clients wait limits the job; else it is the nearest to limiting it.
    named = (
        f"{row.address} limits the job"
        if waiting
        else f"no server limits the job; nearest to it: {row.address}"
    )
    verdict = f"{row.kind}: {named} ({_why(row, len(serving))}) — {row.verdict}{partial}"
    return JobVerdict(kind=row.kind, verdict=verdict, limiting=row.address, **out)


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
        if r.error is not None or r.bad_figures is not None:
            streams = "-" if r.error is not None else str(r.streams)
            table.append((r.address, streams, "-", "-", "-", r.kind))
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
    lines += [
        f"  {r.address}: impossible figures: {r.bad_figures}"
        for r in rows
        if r.bad_figures is not None
    ]
    return "\n".join(lines)


def as_json(
    answers: Sequence[tuple[str, Any]],
    rows: Sequence[ServerRow],
    job: JobVerdict,
    streams_json: Callable[[Any], list[dict]],
) -> str:
    """One line of strict JSON: each server's row and streams (`streams_json` of its info, a
    server with impossible figures too, so they can be seen), and the job's verdict."""
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
        "bad_figures": list(job.bad_figures),
    }
    return strict_json.dumps({"at": time.time(), "servers": servers, "job": verdict})


def run_pool(
    args: argparse.Namespace,
    addresses: Sequence[str],
    streams_json: Callable[[Any], list[dict]],
) -> int:
    """`stats` of several servers, once or `--watch`: 0, or 2 when the last reading left a
    server out (it could not be asked, or its figures were impossible). `streams_json`: a
    server's streams as one server's `--json` gives them (`stats.stream_dicts`: passed in, as
    `stats` is the command that dispatches here)."""
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
