"""The pod's data wait in real MaxText (0.2.5) on two JAX processes (CPU, MaxText's own
multi-process launch), process 1's server reading from slow storage (the stand-in
`SlowPipeline`): both logs name process 1 the worst host with its wait, MaxText's metrics file
holds the worst host's wait and index beside each process's own, and over a restart from a
checkpoint the run's data-loading badput is its first batches' waits plus the worst hosts'
step waits.

Skip locally with `-m "not maxtext"`; CI runs it.
"""

from __future__ import annotations

import json
import re

import pytest

from input_client.badput import job_badput
from input_server.batching import pipeline as batching
from input_server.serving import stream
from input_server.serving.server import Server, ServerConfig
from input_server.testing import SlowPipeline
from tests.support.maxtext import launch_two_hosts, logged_steps

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]

SLOW = 1  # the process whose server reads slowly (not 0, so naming it is no default)
FIRST, LAST = 6, 10  # steps of the first run, then of the run restarted from its checkpoint
# A record's: a packed batch holds a dozen or more documents, so a slow batch takes ~0.3 s or
# more, above the tiny model's step here.
READ_DELAY_S = 0.05
WAIT_LINE = re.compile(
    r"data_wait: ([\d.]+) s, step: (\d+), worst host: process (\d+) waited ([\d.]+) s"
)


@pytest.fixture
def slow_server(tmp_path, monkeypatch):
    """A server whose streams of shard 1 of 2 (process 1's) read from slow storage."""
    real = batching.Pipeline

    def pipeline(spec, *args, **options):
        if (spec.shard.index, spec.shard.count) != (SLOW, 2):
            return real(spec, *args, **options)
        # One document at a time (no worker processes, one thread), as from one slow reader.
        one = spec.replace(workers={"count": 0, "threads": 1})
        slow = SlowPipeline(one, delay_s=READ_DELAY_S)
        slow.group_size = batching.MIN_GROUP  # short groups: slow batches come steadily
        return slow

    monkeypatch.setattr(stream, "Pipeline", pipeline)
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/slow.sock"])) as srv:
        yield srv.targets[0]


def _two_hosts(python, server, addresses, d, model, run, steps, *extra):
    """MaxText's two CPU processes (`launch_two_hosts`), process i fed by
    `addresses[i]` and writing its own metrics file (`metrics{i}-{steps}.jsonl`). Each
    process's log."""

    def each(i: int):
        return (f"metrics_file={d / f'metrics{i}-{steps}.jsonl'}",), {"address": addresses[i]}

    return launch_two_hosts(
        python, server, d, model, run, steps, *extra, each=each, sync_checkpoints=True
    )


def _metrics(d, steps):
    """Each process's train rows of MaxText's metrics file, by step."""
    return [
        {
            int(r["step"]): r
            for r in map(json.loads, (d / f"metrics{i}-{steps}.jsonl").read_text().splitlines())
            if "learning/loss" in r
        }
        for i in (0, 1)
    ]


def _check_run(logs, rows, steps):
    """One run: both logs and both metrics files agree on each step's worst host, the slow
    process is it on most steps, and every worst wait is the longer of the two own waits.
    The worst host's wait of each step, in step order."""
    lines = [{int(s): (float(w), int(p), float(x)) for w, s, p, x in WAIT_LINE.findall(log)}
             for log in logs]  # fmt: skip
    assert sorted(lines[0]) == list(steps), logs[0][-3000:]
    assert sorted(lines[1]) == list(steps), logs[1][-3000:]
    # One gather, two logs: the same worst host and wait; each its own data_wait.
    assert [v[1:] for v in lines[0].values()] == [v[1:] for v in lines[1].values()]
    assert sorted(rows[0]) == sorted(rows[1]) == list(steps)
    worst = []
    for s in steps:
        own = [rows[i][s]["perf/data_wait_seconds"] for i in (0, 1)]
        for i in (0, 1):
            assert rows[i][s]["perf/worst_data_wait_seconds"] == max(own), (s, i, own)
            assert rows[i][s]["perf/worst_data_wait_process"] == own.index(max(own)), (s, own)
        assert lines[0][s][1] == own.index(max(own))
        assert lines[0][s][2] == pytest.approx(max(own), abs=6e-4)  # the log's 3 decimals
        worst.append(max(own))
    # After a run's first step (its compile, whose batch was read ahead: a wait of 0 on any
    # host), slow storage makes the slow host the worst on at least half of the steps.
    later = list(steps)[1:]
    held = [s for s in later if lines[0][s][1] == SLOW]
    assert len(held) >= len(later) / 2, lines[0]
    return worst


def test_two_processes_name_the_slow_host_and_the_badput_spans_a_restart(
    maxtext_python, server, slow_server, specs
):
    d, _, _, model = specs
    badput = d / "badput.jsonl"
    addresses = [server.targets[0], slow_server]
    a = _two_hosts(
        maxtext_python, server, addresses, d, model, "pod", FIRST, "--badput", str(badput)
    )
    first = _check_run(a, _metrics(d, FIRST), range(FIRST))
    # The same run to LAST steps: both processes restore its last checkpoint and go on.
    b = _two_hosts(
        maxtext_python, server, addresses, d, model, "pod", LAST, "--badput", str(badput)
    )
    assert "restoring from this run's directory step" in b[0], b[0][-3000:]
    start = min(logged_steps(b[0]))
    assert FIRST - 1 <= start < LAST
    second = _check_run(b, _metrics(d, LAST), range(start, LAST))

    # The job's badput: each run's first batch (the worst host's) and its later steps' worst.
    figure = job_badput(badput)
    assert figure["restarts"] == 1
    assert [r["processes"] for r in figure["runs"]] == [2, 2]
    assert [r["steps"] for r in figure["runs"]] == [len(first), len(second)]
    assert figure["first_batch_wait_s"] == pytest.approx(first[0] + second[0])
    assert figure["step_wait_s"] == pytest.approx(sum(first[1:]) + sum(second[1:]))
    assert figure["badput_s"] == pytest.approx(sum(first) + sum(second))
