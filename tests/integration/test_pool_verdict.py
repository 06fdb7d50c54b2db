"""`input-server stats` across a pool of real servers: one reading slow storage for a trainer
faster than it (input-bound), one fed well for a trainer slower than it (client-bound); the
table has a row each and the job's verdict names the slow server. An address where nothing
serves is a row saying so, the view partial, exit 2, no traceback. A member reporting figures no
server can (a stand-in: a real gRPC server answering crafted `GetInfo`s) is named as such, never
as the job's limit, and `--json` stays strict JSON (it printed `Infinity` and named the member)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from input_client import InputClient
from input_client.proto import pb
from input_client.wire import PROTOCOL_VERSION
from input_server import cli
from input_server.serving.server import Server, ServerConfig
from input_server.testing.attacks import HostileServer
from tests.support import serve_servicer
from tests.support.figures import IMPOSSIBLE, impossible_stream, strict_json
from tests.support.verdicts import DELAY_S, slow_pipeline


@pytest.fixture
def serve(short_tmp):
    """`serve(name, pipeline)`: a real server on the socket `name`.sock serving it as "p"."""
    with contextlib.ExitStack() as stack:

        def start(name: str, pipeline) -> str:
            config = ServerConfig(
                listen=[f"unix://{short_tmp}/{name}.sock"], pipelines={"p": pipeline}
            )
            return stack.enter_context(Server(config)).targets[0]

        yield start


@contextlib.contextmanager
def trainer(target: str, pace_s: float) -> Iterator[list]:
    """A loop taking a batch of "p" every `pace_s` (0: as fast as they come), on a thread,
    until the block ends."""
    stop, failed = threading.Event(), []

    def loop():
        try:
            with InputClient(target) as client, client.batches("p") as it:
                while not stop.is_set():
                    next(it)
                    time.sleep(pace_s)
        except Exception as e:  # said by the test, not lost on the thread
            failed.append(e)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield failed
    finally:
        stop.set()
        thread.join(30)


def settled(targets: dict[str, str]) -> None:
    """Waits until each server's one stream has the verdict `targets` gives it."""
    deadline = time.monotonic() + 90
    seen = {}
    while time.monotonic() < deadline:
        for target in targets:
            with InputClient(target) as client:
                streams = client.info().streams
            seen[target] = [s.stats.verdict_kind for s in streams]
        if all(seen[t] == [k] for t, k in targets.items()):
            return
        time.sleep(0.5)
    raise AssertionError(f"verdicts not reached in 90 s: {seen}")


def test_the_pool_names_the_server_whose_trainer_waits(serve, make_spec, capsys):
    spec = make_spec(order={"epochs": 0})
    starved = serve("starved", slow_pipeline(spec, read_s=DELAY_S))
    fed = serve("fed", slow_pipeline(spec))
    with trainer(starved, 0.0) as failed_starved, trainer(fed, 0.1) as failed_fed:
        settled({starved: "input-bound", fed: "client-bound"})
        assert cli.main(["stats", starved, fed]) == 0
        table = capsys.readouterr().out.splitlines()
        assert cli.main(["stats", f"{fed},{starved}", "--json"]) == 0  # a fan-in's list
        reading = json.loads(capsys.readouterr().out)
    assert failed_starved == failed_fed == []

    assert table[0] == "pool of 2 servers: 2 answered, 2 streams running"
    assert table[1].split()[0] == "server" and table[1].endswith("verdict")
    starved_row, fed_row = (row.split() for row in table[2:4])
    assert starved_row[0] == starved and starved_row[-1] == "input-bound", table
    assert float(starved_row[4]) >= 5.0 and starved_row[5] == "%"  # its clients' wait share
    assert fed_row[0] == fed and fed_row[-1] == "client-bound", table
    assert table[4].startswith(f"job  input-bound: {starved} limits the job (its clients waited")
    assert "the most of the 2 servers with streams" in table[4]

    assert reading["job"]["limiting"] == starved and reading["job"]["kind"] == "input-bound"
    assert not reading["job"]["partial"]
    rows = {s["address"]: s for s in reading["servers"]}
    assert [s["address"] for s in reading["servers"]] == [fed, starved]  # as named
    assert rows[fed]["kind"] == "client-bound" and rows[fed]["streams_running"] == 1
    assert rows[starved]["wait_share"] >= 0.05
    assert rows[starved]["streams"][0]["stats"]["verdictKind"] == "input-bound"


def test_an_address_where_nothing_serves_is_a_row_and_the_view_partial(
    serve, make_spec, capsys, short_tmp
):
    live = serve("live", slow_pipeline(make_spec(order={"epochs": 0})))
    gone = f"unix://{short_tmp}/gone.sock"
    listed = short_tmp / "pool.txt"
    listed.write_text(f"# the pool\n{live}\n{gone}  # not started\n")
    code = cli.main(["stats", "--addresses-file", str(listed), "--timeout-s", "1"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in out + err
    lines = out.splitlines()
    assert lines[0] == "pool of 2 servers: 1 answered, 0 streams running"
    assert lines[2].split() == [live, "0", "0.0", "0.0", "-", "idle"]
    assert lines[3].split() == [gone, "-", "-", "-", "-", "unreachable"]
    assert (
        lines[4]
        == f"job  idle: no stream running — partial: 1 of 2 servers could not be asked ({gone})"
    )
    assert lines[5].startswith(f"  {gone}: no input server reachable at '{gone}'")

    # --watch reads every server again, each reading one JSON object.
    watch = ["--json", "--watch", "--count", "2", "--interval-s", "0.1", "--timeout-s", "1"]
    assert cli.main(["stats", live, gone, *watch]) == 2
    readings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(readings) == 2 and readings[1]["at"] > readings[0]["at"]
    for r in readings:
        assert r["job"]["kind"] == "idle" and r["job"]["unreachable"] == [gone]
        assert [s["kind"] for s in r["servers"]] == ["idle", "unreachable"]

    # One address keeps the one server's view and its exit code.
    assert cli.main(["stats", gone, "--timeout-s", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines()[-1].startswith("input-server: no input server")


@pytest.fixture(scope="module")
def fed_member(make_spec) -> Iterator[str]:
    """A real server with one running stream, its trainer paced slower than it: a pool member
    whose clients hardly wait, so it limits nothing unless another member is believed."""
    folder = tempfile.mkdtemp(prefix="is-", dir="/tmp")
    config = ServerConfig(
        listen=[f"unix://{folder}/fed.sock"],
        pipelines={"p": slow_pipeline(make_spec(order={"epochs": 0}))},
    )
    try:
        with Server(config) as server, trainer(server.targets[0], 0.05) as failed:
            target = server.targets[0]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with InputClient(target) as client:
                    streams = client.info().streams
                if streams and streams[0].HasField("stats") and streams[0].batches_taken > 2:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"no stream running in 60 s: {streams}")
            yield target
            assert failed == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class ImpossibleFigures(HostileServer):
    """A member whose one running stream's client waits 90 % of its loop (believed, the job's
    limit), with `figures` (`impossible_stream`'s) making one of them what no server can
    report."""

    def __init__(self, figures: dict):
        super().__init__([])
        self.figures = figures

    def GetInfo(self, request, context):
        return pb.GetInfoResponse(
            server_version="hostile",
            protocol_version=PROTOCOL_VERSION,
            streams=[impossible_stream(**self.figures)],
        )


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
def test_a_member_reporting_impossible_figures_is_named_so_not_as_the_limit(
    fed_member, short_tmp, capsys, case
):
    figures, words = IMPOSSIBLE[case]
    evil = f"unix://{short_tmp}/evil.sock"
    listed = short_tmp / "pool.txt"
    listed.write_text(f"{fed_member}\n{evil}\n")
    with serve_servicer(ImpossibleFigures(figures), evil):
        code = cli.main(["stats", "--addresses-file", str(listed), "--json"])
        reading = strict_json(capsys.readouterr().out)
        assert cli.main(["stats", fed_member, evil]) == 2
        table = capsys.readouterr().out.splitlines()
        assert cli.main(["stats", evil, "--json"]) == 0  # one server's view: strict JSON too
        alone = strict_json(capsys.readouterr().out)

    assert code == 2  # the job's view leaves the member out
    job = reading["job"]
    assert job["limiting"] == fed_member, job
    assert job["bad_figures"] == [evil] and job["unreachable"] == [] and job["partial"]
    assert job["verdict"].endswith(
        f"— partial: 1 of 2 servers reported impossible figures ({evil})"
    )
    rows = {r["address"]: r for r in reading["servers"]}
    assert rows[evil]["kind"] == "bad-figures" and words in rows[evil]["bad_figures"]
    assert rows[evil]["streams"][0]["stream_id"] == 7  # what it sent, kept to be seen
    assert rows[fed_member]["bad_figures"] is None  # a real server's figures are possible

    assert table[3].split()[0] == evil and table[3].endswith("bad-figures"), table
    assert table[4].startswith("job  ") and f"{evil} limits" not in table[4], table
    assert fed_member in table[4].split("— partial")[0], table
    assert table[5].startswith(f"  {evil}: impossible figures: stream 7: ") and words in table[5]

    assert [s["stream_id"] for s in alone["streams"]] == [7]
