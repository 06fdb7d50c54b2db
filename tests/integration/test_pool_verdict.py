"""`input-server stats` across a pool of real servers: one reading slow storage for a trainer
faster than it (input-bound), one fed well for a trainer slower than it (client-bound); the
table has a row each and the job's verdict names the slow server. An address where nothing
serves is a row saying so, the view partial, exit 2, no traceback."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import pytest

from input_client import InputClient
from input_server import cli
from input_server.serving.server import Server, ServerConfig
from tests.integration.test_verdicts import DELAY_S, slow


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
    starved = serve("starved", slow(spec, read_s=DELAY_S))
    fed = serve("fed", slow(spec))
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
    live = serve("live", slow(make_spec(order={"epochs": 0})))
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
