"""A pod whose host is late with its first batch, on a real two-process JAX job (CPU, gloo), each
process a real `InputClient` fed by its own real server, one server's storage cold (its first
batch comes late). StepTimer's first gather waits for the late host past the deadline of
gloo's first collective (it failed there, and both processes then hung until SIGKILL); a host
later than `pod_wait_s` is named on every process instead of a hang; and a SIGTERM while the
pod waits ends both processes (jax's preemption service had caught it: they ran on)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

from input_server.batching.pipeline import Pipeline
from input_server.serving.server import Server, ServerConfig

LATE = 1  # not process 0, which holds the coordinator: a late host is no default
STEPS = 5
POD_EVERY = 2
# Past the deadline of gloo's first collective (its `GetKeyValue() timed out` came at 30 s).
PAST_THE_OLD_DEADLINE_S = 35.0

CHILD = """
import json, sys, time
import jax

pid, port, target, pod_wait_s = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
    initialization_timeout=60,
)
from input_client import InputClient, StepTimer

# A trainer builds its model before its data comes: the backend (whose start-up waits for every
# process's) is up before the first batch.
jax.devices()

step = jax.jit(lambda b: (b["inputs"] * 2).sum())
with InputClient(target, connect_timeout_s=30) as client, client.batches("p") as batches:
    timer = StepTimer(data_source=batches, pod_every=POD_EVERY, pod_wait_s=pod_wait_s)
    print("started", time.time(), flush=True)
    for _, batch in zip(range(STEPS), batches):
        timer.step(step, batch)
    print("stepped", time.time(), flush=True)
    timer.flush()
    print(json.dumps({"late": timer.pod_late, "summary": timer.summary()}), flush=True)
""".replace("POD_EVERY", str(POD_EVERY)).replace("STEPS", str(STEPS))


class ColdPipeline(Pipeline):
    """Cold storage: the first stream opened waits `first_delay_s` before its first batch."""

    def __init__(self, spec, first_delay_s: float):
        super().__init__(spec)
        self.first_delay_s = first_delay_s

    def stream_opened(self) -> None:
        delay, self.first_delay_s = self.first_delay_s, 0.0
        time.sleep(delay)
        super().stream_opened()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _pod(make_spec, tmp_path, first_delay_s: float, pod_wait_s: float):
    """The two processes, started (each process's output in `tmp_path / f"{i}.log"`), killed
    on the way out whatever they did."""
    spec = make_spec(order={"epochs": 0})
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    port = _free_port()
    with contextlib.ExitStack() as stack:
        children = []
        for i in range(2):
            pipeline = ColdPipeline(spec, first_delay_s) if i == LATE else Pipeline(spec)
            config = ServerConfig(listen=[f"unix://{tmp_path}/{i}.sock"], pipelines={"p": pipeline})
            target = stack.enter_context(Server(config)).targets[0]
            log = stack.enter_context(open(tmp_path / f"{i}.log", "wb"))  # noqa: SIM115
            argv = [sys.executable, "-c", CHILD, str(i), str(port), target, str(pod_wait_s)]
            children.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log))
        try:
            yield children
        finally:
            for child in children:
                child.kill()
                child.wait()


def _wait_all(children, seconds: float) -> float:
    """Waits for every child, at most `seconds` in all; the seconds it took."""
    start = time.monotonic()
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(max(0.1, start + seconds - time.monotonic()))
    return time.monotonic() - start


def _results(tmp_path) -> list[dict]:
    out = []
    for i in range(2):
        lines = (tmp_path / f"{i}.log").read_text().splitlines()
        out.append(json.loads(next(line for line in reversed(lines) if line.startswith("{"))))
    return out


def test_a_host_late_past_gloos_first_deadline_is_waited_for_and_named(make_spec, tmp_path):
    with _pod(make_spec, tmp_path, PAST_THE_OLD_DEADLINE_S, pod_wait_s=600) as children:
        _wait_all(children, 150)
        codes = [child.poll() for child in children]
    logs = [(tmp_path / f"{i}.log").read_text()[-3000:] for i in range(2)]
    assert codes == [0, 0], logs
    for result in _results(tmp_path):
        summary = result["summary"]
        assert result["late"] == [] and summary["pod_steps"] == STEPS - 1, result
        # The late host is named as the first batch's worst, with its start-up's wait.
        assert summary["pod_first_process"] == LATE, summary
        assert summary["pod_first_data_wait_s"] >= PAST_THE_OLD_DEADLINE_S - 5, summary


def test_a_host_later_than_pod_wait_s_is_named_on_every_process(make_spec, tmp_path):
    with _pod(make_spec, tmp_path, first_delay_s=15, pod_wait_s=3) as children:
        _wait_all(children, 90)
        codes = [child.poll() for child in children]
    logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], [log[-3000:] for log in logs]
    for result in _results(tmp_path):
        assert result["late"] == [LATE], result
        assert result["summary"]["pod_late_processes"] == [LATE], result
        assert "pod_processes" not in result["summary"], result
    assert (
        f"processes [{LATE}] of 2 had not finished their first step when the pod stopped" in logs[0]
    )


def test_sigterm_while_the_pod_waits_for_a_late_host_ends_both_processes(make_spec, tmp_path):
    with _pod(make_spec, tmp_path, first_delay_s=120, pod_wait_s=600) as children:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            "started" in (tmp_path / f"{i}.log").read_text() for i in range(2)
        ):
            time.sleep(0.2)
        time.sleep(3)  # process 0's first steps, then its wait for the late host
        assert [child.poll() for child in children] == [None, None]
        for child in children:  # as a scheduler stops a job: every host
            child.send_signal(signal.SIGTERM)
        took = _wait_all(children, 30)
        codes = [child.poll() for child in children]
    logs = [(tmp_path / f"{i}.log").read_text()[-3000:] for i in range(2)]
    assert None not in codes and took < 10, (took, codes, logs)
    assert codes[0] == -signal.SIGTERM, logs
    assert f"waited for processes [{LATE}] to finish their first step" in logs[0], logs
