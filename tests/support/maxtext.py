"""Real MaxText (0.2.5, its own Python 3.12 venv that scripts/tools/maxtext_venv.sh builds) run by
the launcher (`python -m input_client.maxtext.train`) against a test's server: one process or
two, what its log says of each step, and each batch's `total_weights` by MaxText's rule."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from input_client.maxtext.conventions import to_maxtext
from input_server.testing.maxtext import TINY_MAXTEXT
from tests.support.parallel import file_lock

SEQ, ROWS, STEPS = 256, 8, 20  # the tiny decoder's rows, and a run's steps by default
STEP_LINE = re.compile(
    r"completed step: (\d+), .*?total_weights: (\d+), loss: ([\d.]+), "
    r"lm_loss: [\d.]+, perplexity: ([\d.]+)"
)
MODEL = [*TINY_MAXTEXT, f"max_target_length={SEQ}", f"per_device_batch_size={ROWS}"]
ONE_HOST = ["skip_jax_distributed_system=true"]
PROG = "python -m input_client.maxtext.train: "  # the launcher's one-line mistakes start so


def launch(
    python,
    server,
    d,
    model,
    run,
    *extra,
    spec="train",
    stream=False,
    steps=STEPS,
    env=None,
    evaluate=True,
    sync_checkpoints=False,
    address=None,
):
    """The launcher in `python` (the MaxText venv's) on `d`/SPEC.toml (and `d`/eval.toml with
    `evaluate`), fed by `server` (or `address`), checkpointing every 5 steps into `d`/out/RUN;
    `extra`: more MaxText keys. Run to its end (`subprocess.run`'s result), or with `stream`
    started in a session of its own, its stderr a pipe (the `Popen`)."""
    argv = [
        python,
        "-m",
        "input_client.maxtext.train",
        "--server",
        address or server.targets[0],
        "--connect-timeout-s",
        "3",
        "--spec",
        str(d / f"{spec}.toml"),
        *(["--eval-spec", str(d / "eval.toml")] if evaluate else []),
        f"run_name={run}",
        f"base_output_directory={d / 'out'}",
        f"tokenizer_path={model}",
        *MODEL,
        f"steps={steps}",
        "checkpoint_period=5",
        "enable_checkpointing=true",
        *(["async_checkpointing=false"] if sync_checkpoints else []),
        f"eval_interval={10 if evaluate else -1}",
        "eval_steps=50",
        *extra,
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DECOUPLE_GCLOUD": "TRUE", **(env or {})}
    env.pop("XLA_FLAGS", None)  # one CPU device, as the model's batch is sized
    if stream:
        return subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)


def logged_steps(log: str) -> dict[int, tuple[int, str, str]]:
    """Each step MaxText's log completed: its total_weights, loss and perplexity (as logged)."""
    return {int(s): (int(w), loss, ppl) for s, w, loss, ppl in STEP_LINE.findall(log)}


def step_weights(log: str) -> dict[int, int]:
    """Each step MaxText's log completed: its total_weights."""
    return {s: w for s, (w, _, _) in logged_steps(log).items()}


def total_weight(batch, packing, pad_id: int = -1) -> int:
    """A batch's `total_weights` as MaxText's loss counts it (targets_segmentation != 0)."""
    return int((to_maxtext(batch, pad_id, packing)["targets_segmentation"] != 0).sum())


def total_weights(spec, server, n=None, pad_id: int = -1) -> list[int]:
    """Each batch's `total_weights`, for the first `n` batches of `spec` (all: None) from
    `server`, MaxText's pad id being `pad_id`."""
    from input_client import InputClient

    out = []
    with InputClient(server.targets[0]) as c, c.batches(spec) as it:
        for b in it:
            out.append(total_weight(b, spec.batch.packing, pad_id))
            if n is not None and len(out) == n:
                break
    return out


def assert_one_launcher_line(out, code, *needles):
    """The launcher's run ended with exit `code` and one line of its own naming each needle,
    no traceback."""
    assert out.returncode == code, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(PROG), last
    for needle in needles:
        assert needle in last, (needle, last)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the coordinator binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def launch_two_hosts(python, server, d, model, run, steps, *extra, each=None, **options):
    """Two JAX processes on this machine, as MaxText's CPU launcher (XPK) starts them; MaxText
    fixes the coordinator's port at 1234, so one such pair runs at a time on the machine (a
    lock file in its temporary folder). `extra` and `options` go to `launch`, and so do
    `each(i)`'s (arguments, options) for process i alone. Each process's log, also written to
    `d/log{i}-{steps}.txt` for a failure's reader."""
    with file_lock(pathlib.Path(tempfile.gettempdir()) / "input-server-maxtext-1234.lock"):
        return _two_hosts_now(python, server, d, model, run, steps, *extra, each=each, **options)


def _two_hosts_now(python, server, d, model, run, steps, *extra, each, **options):
    own = [each(i) if each is not None else ((), {}) for i in (0, 1)]
    if not _port_free(1234):
        pytest.fail("port 1234, where MaxText's CPU processes meet, is taken on this host")
    procs = [
        launch(
            python,
            server,
            d,
            model,
            run,
            "skip_jax_distributed_system=false",
            *extra,
            *own[i][0],
            stream=True,
            steps=steps,
            evaluate=False,
            env={
                "JAX_COORDINATOR_ADDRESS": "localhost",
                "JOB_INDEX": "0",
                "JOB_COMPLETION_INDEX": str(i),
                "PROCESSES_IN_JOB": "2",
                "JAX_PROCESS_COUNT": "2",
            },
            **options,
            **own[i][1],
        )
        for i in (0, 1)
    ]
    try:
        with ThreadPoolExecutor(2) as pool:  # both at once: a full pipe would stall a process
            logs = list(pool.map(lambda p: p.stderr.read(), procs))
        for i, (p, log) in enumerate(zip(procs, logs, strict=True)):
            (d / f"log{i}-{steps}.txt").write_text(log)
            assert p.wait(timeout=600) == 0, log[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return logs
