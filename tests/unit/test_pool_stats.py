"""`input-server stats` across a pool, its rules on `GetInfoResponse`s as servers answer them:
which stream speaks for a server, which server limits the job, what an unreachable one makes
of the verdict, the addresses a command line and a file name, every server string quoted."""

from __future__ import annotations

import argparse
import json

import pytest

from input_client.proto import pb
from input_server.cli.connection import BadAddresses, addresses_of
from input_server.cli.pool_stats import ServerRow, as_json, format_pool, limiting
from input_server.cli.stats import stream_dicts
from tests.support import assert_one_line, run_main
from tests.support.figures import IMPOSSIBLE, impossible_stream, strict_json


def stream(
    stream_id: int,
    kind: str,
    *,
    wait: float = -1.0,
    taken: float = 10.0,
    could: float = 20.0,
    verdict: str | None = None,
) -> pb.StreamInfo:
    """A running stream as `GetInfo` shows it: its verdict, its client's wait share (-1: not
    reported), the batches/s its loop takes and it could make, with batches sent and taken."""
    return pb.StreamInfo(
        stream_id=stream_id,
        pipeline="p",
        batches_sent=100,
        batches_produced=102,
        batches_taken=100,
        consumed_batches_per_s=taken,
        stats=pb.StreamStats(
            client_wait_share=wait,
            client_wait_s=max(wait, 0.0) * 10,
            production_batches_per_s=could,
            verdict_kind=kind,
            verdict=verdict or f"{kind}: because",
        ),
    )


def info(*streams: pb.StreamInfo) -> pb.GetInfoResponse:
    return pb.GetInfoResponse(server_version="test", streams=streams)


def test_a_server_speaks_by_its_stream_whose_trainer_waits_most():
    row = ServerRow.of(
        "a:1",
        info(
            stream(1, "client-bound", wait=0.001, taken=5, could=50),
            stream(2, "input-bound", wait=0.3, taken=8, could=8.2),
            stream(3, "read-bound"),  # its client does not report its wait
        ),
    )
    assert (row.kind, row.stream_id, row.streams) == ("input-bound", 2, 3)
    assert row.verdict == "stream 2: input-bound: because"
    assert row.taken == pytest.approx(23) and row.could_make == pytest.approx(78.2)
    assert row.wait_share == pytest.approx(0.3)
    assert row.headroom == pytest.approx(8.2 / 8)


def test_the_job_is_limited_by_the_server_whose_clients_wait_most():
    rows = [
        ServerRow.of("a:1", info(stream(1, "input-bound", wait=0.08, taken=10, could=10.5))),
        ServerRow.of("b:1", info(stream(1, "input-bound", wait=0.25, taken=10, could=30))),
        # Less headroom, but its trainer waits under 5 %: the others' waits decide.
        ServerRow.of("c:1", info(stream(1, "balanced", wait=0.02, taken=10, could=10.1))),
    ]
    job = limiting(rows)
    assert (job.kind, job.limiting, job.partial) == ("input-bound", "b:1", False)
    assert job.verdict.startswith(
        "input-bound: b:1 limits the job (its clients waited 25.0 % of their time, the most of "
        "the 3 servers with streams: production 3.0 x demand) — stream 1: input-bound: because"
    )


def test_with_no_trainer_waiting_the_least_headroom_limits_the_job():
    rows = [
        ServerRow.of("a:1", info(stream(1, "client-bound", wait=0.001, taken=10, could=90))),
        ServerRow.of("b:1", info(stream(1, "read-bound", wait=0.004, taken=10, could=13))),
        ServerRow.of("c:1", info()),  # no stream: idle, never the limit
    ]
    job = limiting(rows)
    assert (job.kind, job.limiting) == ("read-bound", "b:1")
    assert job.verdict.startswith("read-bound: no server limits the job; nearest to it: b:1 (")
    assert (
        "no server's clients waited 5.0 % of their time; its production headroom is the least "
        "of the 2 servers with streams: production 1.3 x demand"
    ) in job.verdict
    assert rows[2].kind == "idle"


def test_an_unreachable_server_is_a_row_and_makes_the_view_partial():
    rows = [
        ServerRow.of("a:1", info(stream(4, "starting"))),
        ServerRow.unreachable("b:1", "no input server reachable at 'b:1' after 1 s"),
    ]
    job = limiting(rows)
    assert (job.kind, job.limiting, job.unreachable) == ("starting", "a:1", ("b:1",))
    assert job.verdict.endswith("— partial: 1 of 2 servers could not be asked (b:1)")
    table = format_pool(rows, job).splitlines()
    assert table[0] == "pool of 2 servers: 1 answered, 1 stream running"
    assert table[2].split() == ["a:1", "1", "10.0", "20.0", "not", "reported", "starting"]
    assert table[3].split() == ["b:1", "-", "-", "-", "-", "unreachable"]
    assert table[4].startswith("job  starting: no server limits the job; nearest to it: a:1")
    assert table[5] == "  b:1: no input server reachable at 'b:1' after 1 s"
    answers = [("a:1", info(stream(4, "starting"))), ("b:1", "gone")]
    out = json.loads(as_json(answers, rows, job, stream_dicts))
    assert out["job"] == {
        "kind": "starting",
        "verdict": job.verdict,
        "limiting": "a:1",
        "partial": True,
        "unreachable": ["b:1"],
        "bad_figures": [],
    }
    assert [s["streams_running"] for s in out["servers"]] == [1, 0]
    assert out["servers"][0]["streams"][0]["stats"]["verdictKind"] == "starting"
    assert out["servers"][1]["error"].startswith("no input server")


def test_no_server_answering_is_unreachable_and_none_streaming_is_idle():
    gone = [ServerRow.unreachable(a, "gone") for a in ("a:1", "b:1")]
    assert limiting(gone).verdict == "unreachable: none of the 2 servers could be asked"
    idle = limiting([ServerRow.of("a:1", info()), ServerRow.unreachable("b:1", "gone")])
    assert idle.kind == "idle" and idle.limiting is None and idle.partial


def test_every_string_a_server_sent_is_quoted():
    hostile = "input-bound: x\n\x1b[31mFAKE LINE"
    rows = [ServerRow.of("a:1\n", info(stream(1, "input\x1b", wait=0.5, verdict=hostile)))]
    text = format_pool(rows, limiting(rows))
    assert "\x1b" not in text and "\\x1b[31mFAKE LINE" in text
    assert "a:1\\n" in text and "x\\n" in text
    assert len(text.splitlines()) == 4  # header, columns, the row, the job: nothing forged


def _args(*addresses: str, file: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(addresses=list(addresses), addresses_file=file)


def test_addresses_from_arguments_and_a_file(tmp_path):
    listed = tmp_path / "pool.txt"
    listed.write_text("# the pool\nhost-2:50051  # the third\n\n  host-3:50051\n")
    assert addresses_of(_args("host-0:50051,host-1:50051", file=str(listed))) == [
        "host-0:50051",
        "host-1:50051",
        "host-2:50051",
        "host-3:50051",
    ]
    # gRPC's own address lists stay one target, as the client's fan-in takes them.
    assert addresses_of(_args("ipv4:10.0.0.1:1,10.0.0.2:1")) == ["ipv4:10.0.0.1:1,10.0.0.2:1"]
    assert addresses_of(_args()) == []  # the default server


@pytest.mark.parametrize(
    "argv, needle",
    [
        pytest.param(["a:1", "b:1", "a:1"], "a:1 named twice", id="twice"),
        pytest.param(["a:1,,b:1"], "an empty address", id="empty"),
        pytest.param(["--addresses-file", "/nonexistent/pool.txt"], "cannot read", id="no-file"),
    ],
)
def test_addresses_that_cannot_be_asked_are_one_line(capsys, argv, needle):
    code, err = run_main(capsys, "stats", *argv)
    assert_one_line(code, err, needle)


def test_a_file_naming_no_server_is_refused(tmp_path):
    empty = tmp_path / "pool.txt"
    empty.write_text("# nobody yet\n\n")
    with pytest.raises(BadAddresses, match="names no server"):
        addresses_of(_args(file=str(empty)))


def test_the_impossible_stream_is_possible_until_a_figure_is_made_impossible():
    assert ServerRow.of("evil:1", info(impossible_stream())).bad_figures is None


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
def test_a_member_reporting_impossible_figures_is_named_so_and_never_limits(case):
    craft, words = IMPOSSIBLE[case]
    answers = [
        ("good:1", info(stream(1, "input-bound", wait=0.2, taken=10, could=10.5))),
        ("evil:1", info(impossible_stream(**craft))),
    ]
    rows = [ServerRow.of(a, i) for a, i in answers]
    job = limiting(rows)
    evil = rows[1]
    assert (evil.kind, evil.stream_id) == ("bad-figures", None)
    assert evil.bad_figures.startswith("stream 7: ") and words in evil.bad_figures, evil
    assert (job.kind, job.limiting, job.bad_figures) == ("input-bound", "good:1", ("evil:1",))
    assert job.partial and job.unreachable == ()
    assert job.verdict.endswith("— partial: 1 of 2 servers reported impossible figures (evil:1)")
    table = format_pool(rows, job).splitlines()
    assert table[3].split() == ["evil:1", "1", "-", "-", "-", "bad-figures"]
    assert table[4].startswith("job  input-bound: good:1 limits the job")
    assert table[5] == f"  evil:1: impossible figures: {evil.bad_figures}"
    out = strict_json(as_json(answers, rows, job, stream_dicts))
    assert out["job"]["limiting"] == "good:1" and out["job"]["bad_figures"] == ["evil:1"]
    assert out["servers"][1]["bad_figures"] == evil.bad_figures
    assert out["servers"][1]["streams"][0]["stream_id"] == 7  # what it sent, to be seen


def test_a_pool_of_only_impossible_figures_and_unreachable_servers_names_neither():
    rows = [
        ServerRow.of("evil:1", info(impossible_stream(share=float("nan")))),
        ServerRow.unreachable("gone:1", "gone"),
    ]
    job = limiting(rows)
    assert (job.kind, job.limiting) == ("bad-figures", None)
    assert job.verdict == (
        "bad-figures: no server answered with figures that can be true — partial: 1 of 2 "
        "servers could not be asked (gone:1); 1 of 2 servers reported impossible figures (evil:1)"
    )


def test_figures_that_are_not_finite_numbers_are_null_in_strict_json():
    """Protobuf's JSON mapping writes them as the strings "NaN" and "Infinity" (a reader
    expecting a number takes them for text), json.dumps as bare NaN and Infinity (strict
    parsers refuse the whole reading): both are null; a string that reads "NaN" stays."""
    from input_server.cli.stats import as_json as one_server_json

    s = stream(1, "input-bound", wait=0.9, verdict="NaN", taken=float("inf"), could=float("nan"))
    s.stats.stages.add(stage="read", seconds=float("-inf"))
    answer = info(s)
    answer.totals.client_wait_s = float("inf")
    out = strict_json(one_server_json(answer))
    figures = out["streams"][0]
    assert figures["consumed_batches_per_s"] is None
    assert figures["stats"]["productionBatchesPerS"] is None
    assert figures["stats"]["stages"] == [{"stage": "read", "seconds": None}]
    assert figures["stats"]["verdict"] == "NaN" and figures["stats"]["clientWaitShare"] == 0.9
    assert out["totals"]["clientWaitS"] is None
    rows = [ServerRow.of("evil:1", answer)]
    pool = strict_json(as_json([("evil:1", answer)], rows, limiting(rows), stream_dicts))
    assert pool["servers"][0]["streams"][0]["consumed_batches_per_s"] is None
