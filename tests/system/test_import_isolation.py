"""The thin client in a fresh interpreter: it imports, and streams, without the server's heavy
packages (Grain, sentencepiece) or jax."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest


def test_client_imports_without_jax():
    code = (
        "import sys, input_client, input_client.timing; "
        "t = input_client.timing.StepTimer(tokens_per_step=1); "
        "assert 'jax' not in sys.modules, 'jax imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_client_streams_without_grain_sentencepiece_or_jax(server, make_spec):
    spec = make_spec()
    code = textwrap.dedent(f"""
        import json, sys
        from input_client import InputClient, PipelineSpec
        spec = PipelineSpec.from_dict(json.loads({json.dumps(json.dumps(spec.to_dict()))}))
        with InputClient({server.targets[0]!r}) as c, c.batches(spec) as it:
            n = sum(1 for _ in it)
        heavy = [m for m in ("grain", "sentencepiece", "jax") if m in sys.modules]
        print(json.dumps({{"batches": n, "heavy": heavy}}))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["batches"] > 10
    assert result["heavy"] == []


def test_the_server_listens_before_grain_or_jax_loads():
    """`serve`'s path to its socket imports neither Grain nor JAX (most of a restarted sidecar's
    time to listening before; docs/benchmarks.md, "Time to a first batch after a (re)start"):
    the server loads Grain behind its socket (`serving/warm.py`), and JAX never."""
    code = (
        "import sys, input_server.cli, input_server.cli.serve, input_server.serving.server; "
        "print([m for m in ('grain', 'jax') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("processes", [0, 1])
def test_a_serve_process_streams_without_ever_loading_jax(
    tmp_path, corpus, spm_model, make_spec, processes
):
    """JAX is the trainer's: a `serve` process keeps it out (`warm.keep_jax_out`), and so do
    the worker processes Grain spawns for it; Grain, which imports JAX when it can, serves with
    its own pytrees. No process of the server maps jaxlib's extension once it has streamed
    (a process that imported JAX does), the batches are the in-process pipeline's, and Grain's
    warning about the missing JAX reaches no log: with `--log-format json` every line the
    server and its workers write on stderr is JSON."""
    import psutil

    from input_client import InputClient
    from tests.support import assert_same_batches, run_pipeline, serve_files

    child, target = serve_files(tmp_path, corpus, spm_model, flags=["--log-format", "json"])
    try:
        spec = make_spec(workers={"count": processes, "threads": 2}, order={"epochs": 1})
        maps = {}
        with InputClient(target) as client, client.batches(spec) as it:
            served = [next(it)]
            server = psutil.Process(child.p.pid)
            workers = [p for p in server.children() if "spawn_main" in " ".join(p.cmdline())]
            for p in [server, *workers]:  # the worker processes live while the stream does
                with open(f"/proc/{p.pid}/maps") as f:
                    maps[" ".join(p.cmdline())[:160]] = f.read()
            served += list(it)
    finally:
        child.kill()
    assert len(workers) == processes, maps.keys()
    assert not [cmd for cmd, text in maps.items() if "jaxlib" in text]
    assert_same_batches(served, run_pipeline(spec))
    with open(tmp_path / "s.log") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    for line in lines:
        json.loads(line)  # not JSON: a line Grain (or anything else) wrote as plain text
