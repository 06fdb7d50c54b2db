"""The pod's view on a real multi-process JAX job (CPU, gloo): three processes, each a real
`InputClient` fed by its own real server, one of those servers reading from slow storage (the
stand-in `SlowPipeline`). Every process's `StepTimer` names the slow process as the worst host
on the steps it held, with its wait bit for bit; each process's own figures stay its own; the
job's data-loading badput over a restart is its first-batch waits plus the worst hosts' step
waits."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from input_client.badput import job_badput
from input_server.batching.pipeline import MIN_GROUP, Pipeline
from input_server.serving.server import Server, ServerConfig
from input_server.testing import SlowPipeline
from tests.support import ROOT, run_main

PROCESSES = 3
SLOW = 1  # not process 0, so naming it is no default
STEPS = 22  # not a multiple of POD_EVERY: flush() gathers a last, shorter window
POD_EVERY = 4
# A record's: a few records a batch, far above a fed server's batch time. The slow process
# waits once the batches read ahead while every stream started (~0.8 s here) are used up.
READ_DELAY_S = 0.03
TRAINER = str(ROOT / "tests" / "integration" / "pod_trainer.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(make_spec, tmp_path_factory):
    """The job, run once: each process's JSON (by process index), the badput file, process 0's
    records file."""
    tmp = tmp_path_factory.mktemp("pod")
    spec = make_spec(order={"epochs": 0})
    slow = SlowPipeline(spec, delay_s=READ_DELAY_S)
    slow.group_size = MIN_GROUP  # short groups: slow batches come steadily, not in bursts
    sockets = tmp_path_factory.mktemp("s")
    badput = tmp / "badput.jsonl"
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        # Two devices a process: the gather's mesh has a row a process, a column a device.
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    port = _free_port()
    with contextlib.ExitStack() as stack:
        targets = []
        for i in range(PROCESSES):
            pipeline = slow if i == SLOW else Pipeline(spec)
            config = ServerConfig(listen=[f"unix://{sockets}/{i}.sock"], pipelines={"p": pipeline})
            targets.append(stack.enter_context(Server(config)).targets[0])
        children = []
        for i in range(PROCESSES):
            argv = [
                sys.executable, TRAINER, "--process-id", str(i), "--processes", str(PROCESSES),
                "--port", str(port), "--server", targets[i], "--steps", str(STEPS),
                "--pod-every", str(POD_EVERY), "--out", str(tmp / f"{i}.json"),
                "--badput", str(badput), "--records", str(tmp / f"records{i}.jsonl"),
            ]  # fmt: skip
            log = stack.enter_context(open(tmp / f"{i}.log", "wb"))  # noqa: SIM115
            children.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log))
        deadline = time.monotonic() + 120
        try:
            for child in children:
                child.wait(max(1.0, deadline - time.monotonic()))
        finally:
            for child in children:
                child.kill()
        for i, child in enumerate(children):
            assert child.returncode == 0, (tmp / f"{i}.log").read_text()[-3000:]
    out = {i: json.loads((tmp / f"{i}.json").read_text()) for i in range(PROCESSES)}
    return out, badput, tmp / "records0.jsonl"


def _every_process_gathers_the_same_steps_from_each_processs_own_figures(job):
    out, _, _ = job
    for r in range(2):  # the first run and the restart
        gathered = out[0]["runs"][r]["pod_steps"]
        assert len(gathered) == STEPS
        for p in range(PROCESSES):
            assert out[p]["runs"][r]["pod_steps"] == gathered
            records = out[p]["runs"][r]["records"]
            # Bit for bit: each process's column is that process's own record.
            assert [s["data_wait_s"][p] for s in gathered] == [x["data_wait_s"] for x in records]
            assert [s["step_s"][p] for s in gathered] == [x["step_s"] for x in records]


def _the_slow_process_is_the_worst_host_on_the_steps_it_held(job):
    out, _, records0 = job
    for r in range(2):
        gathered = out[0]["runs"][r]["pod_steps"]
        held = [
            s["index"]
            for s in gathered
            if all(s["data_wait_s"][SLOW] > w for p, w in enumerate(s["data_wait_s"]) if p != SLOW)
        ]
        # Slow storage makes the slow process wait on most steps once its read-ahead is used.
        assert len(held) >= STEPS // 4, gathered
        summary = out[0]["runs"][r]["summary"]
        assert summary["pod_processes"] == PROCESSES
        assert summary["pod_most_often_worst"]["process"] == SLOW, summary
        assert summary["pod_input_bound_steps"] >= 0.2, summary
        # The first batch's worst wait, left out of the counted steps, is given apart.
        first = gathered[0]["data_wait_s"]
        worst = max(range(PROCESSES), key=lambda p: (first[p], -p))
        assert summary["pod_first_data_wait_s"] == first[worst], summary
        assert summary["pod_first_process"] == worst, summary
    # Process 0's lines (a fed process) name the slow host on the steps it held, with its wait.
    lines = [json.loads(line) for line in records0.read_text().splitlines()]
    assert len(lines) == 2 * STEPS
    first_run = out[0]["runs"][0]["pod_steps"]
    for line, step in zip(lines[:STEPS], first_run, strict=True):
        waits = step["data_wait_s"]
        if all(waits[SLOW] > w for p, w in enumerate(waits) if p != SLOW):
            assert line["worst_process"] == SLOW
            assert line["worst_data_wait_s"] == waits[SLOW]
        assert line["worst_step_s"] == step["step_s"][line["worst_process"]]
        assert line["process"] == 0 and line["data_wait_s"] == waits[0]  # its own, unchanged


def _each_process_keeps_its_own_figures(job):
    out, _, _ = job
    for p in range(PROCESSES):
        own = out[p]["runs"][0]
        # The local records are this process's iterator's wait, the pod's view beside them.
        assert sum(x["data_wait_s"] for x in own["records"]) == pytest.approx(own["wait_time_s"])
        assert own["summary"]["total_data_wait_s"] == pytest.approx(
            sum(x["data_wait_s"] for x in own["records"][1:])
        )
    slow_wait = out[SLOW]["runs"][0]["summary"]["total_data_wait_s"]
    for p in range(PROCESSES):
        if p != SLOW:
            assert out[p]["runs"][0]["summary"]["total_data_wait_s"] < slow_wait / 3


def _the_badput_over_a_restart_is_first_batches_plus_worst_step_waits(job):
    out, badput, _ = job
    figure = job_badput(badput)
    assert figure["restarts"] == 1
    runs = out[0]["runs"]
    worst = [[max(s["data_wait_s"]) for s in run["pod_steps"]] for run in runs]
    assert figure["first_batch_wait_s"] == pytest.approx(sum(w[0] for w in worst))
    assert figure["step_wait_s"] == pytest.approx(sum(sum(w[1:]) for w in worst))
    assert figure["badput_s"] == pytest.approx(sum(sum(w) for w in worst))
    assert [r["run"] for r in figure["runs"]] == [run["run"] for run in runs]  # process 0's


def _plot_steps_draws_the_worst_host_beside_process_0(job, capsys, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    _, _, records0 = job
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # kept open for inspection
    assert run_main(capsys, "plot-steps", str(records0), "-o", str(tmp_path / "p.png")) == (0, "")
    lines = [json.loads(line) for line in records0.read_text().splitlines()]
    for ax, run in zip(figures[0].axes, (lines[:STEPS], lines[STEPS:]), strict=True):
        drawn = {line.get_label(): line for line in ax.get_lines()}
        worst = drawn["worst host's data wait s"]
        assert list(worst.get_ydata()) == [x["worst_data_wait_s"] for x in run[1:]]
        other = [x["index"] for x in run[1:] if x["worst_process"] != 0]
        assert list(drawn["another host was worst"].get_xdata()) == other
        assert f"process 0; worst host process {SLOW} (" in ax.get_title(), ax.get_title()


def test_three_processes_one_over_slow_storage(
    make_spec, tmp_path_factory, capsys, tmp_path, monkeypatch
):
    """One test, one job: the processes take ~30 s to start and run, which a test each (on
    parallel workers) would pay again."""
    pytest.importorskip("matplotlib")
    job = _run_job(make_spec, tmp_path_factory)
    _every_process_gathers_the_same_steps_from_each_processs_own_figures(job)
    _the_slow_process_is_the_worst_host_on_the_steps_it_held(job)
    _each_process_keeps_its_own_figures(job)
    _the_badput_over_a_restart_is_first_batches_plus_worst_step_waits(job)
    _plot_steps_draws_the_worst_host_beside_process_0(job, capsys, tmp_path, monkeypatch)
