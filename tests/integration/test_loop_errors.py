"""A user's mistake reaches their training loop as one exception of a public class, with a
traceback of a few lines: the loop's own line, never the client's threads and reconnects."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import input_client

# The loop's frame, the iterator's `__next__` (two lines each), "Traceback ..." and the error:
# before, a refused stream took 22 lines through iterator.py, threads.py and `_reopen`.
MAX_LINES = 8


def _loop(script: str, env: dict[str, str] | None = None) -> list[str]:
    """Runs `script` as a user's training script would; the lines of its traceback."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [root, os.path.join(root, "client"), os.environ.get("PYTHONPATH", "")]
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **(env or {})},
    )
    assert run.returncode == 1, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Traceback"))
    return lines[start:]


def _assert_short_and_public(lines: list[str], error: str) -> None:
    shown = "\n".join(lines)
    assert lines[-1].startswith(f"{error}: "), shown
    assert len(lines) <= MAX_LINES, shown
    for noise in ("threads.py", "_reopen", "_fetch", "input_client._", "During handling"):
        assert noise not in shown, shown


def test_a_stream_the_server_refuses_is_one_public_error_in_a_few_lines(server, make_spec):
    spec = make_spec(source={"paths": ["/nonexistent/corpus.jsonl"]})
    lines = _loop(
        f"""
        from input_client import InputClient, PipelineSpec
        spec = PipelineSpec.from_dict({spec.to_dict()!r})
        with InputClient({server.targets[0]!r}, connect_timeout_s=30) as client:
            for batch in client.batches(spec, reconnect_deadline_s=0):
                pass
        """
    )
    _assert_short_and_public(lines, "input_client.errors.StreamError")
    assert "/nonexistent/corpus.jsonl" in lines[-1]  # the server's words, its status first
    assert lines[-1].split(": ", 2)[1] in ("NOT_FOUND", "PERMISSION_DENIED", "INVALID_ARGUMENT")


def test_a_spec_mistake_in_the_loop_is_the_public_spec_error(corpus, spm_model):
    lines = _loop(
        f"""
        from input_client import PipelineSpec
        for seq_len in (128, -1):
            PipelineSpec(
                source={{"paths": [{corpus!r}]}},
                tokenizer={{"model": {spm_model!r}}},
                batch={{"seq_len": seq_len, "size": 4}},
            )
        """
    )
    shown = "\n".join(lines)
    assert lines[-1].startswith("input_client.errors.SpecError: `batch.seq_len`"), shown
    assert "_spec_checks.SpecError" not in shown
    assert len(lines) <= 12, shown  # the spec's own check frames, no more


def test_a_spec_value_the_server_refuses_is_a_spec_error_too(server, make_spec, corpus):
    """The corpus given as the tokenizer model: only the server can find that out. The loop
    gets a SpecError naming the key (and a StreamError with the server's status)."""
    spec = make_spec(tokenizer={"model": corpus})
    lines = _loop(
        f"""
        import grpc
        from input_client import InputClient, PipelineSpec, SpecError, StreamError
        spec = PipelineSpec.from_dict({spec.to_dict()!r})
        with InputClient({server.targets[0]!r}, connect_timeout_s=30) as client:
            try:
                for batch in client.batches(spec, reconnect_deadline_s=0):
                    pass
            except SpecError as e:
                assert isinstance(e, StreamError) and isinstance(e, ValueError)
                assert e.key == "tokenizer.model", e.key
                assert e.code == grpc.StatusCode.INVALID_ARGUMENT
                raise
        """
    )
    _assert_short_and_public(lines, "input_client.errors.ServerSpecError")
    assert "INVALID_ARGUMENT: `tokenizer.model`" in lines[-1]


@pytest.mark.parametrize(
    "code, details, key",
    [
        ("INVALID_ARGUMENT", "`source[2].paths` matches no file", "source[2].paths"),
        ("INVALID_ARGUMENT", "`resume_state` is not a state of this spec", None),
        ("NOT_FOUND", "`source.paths`: no file matches", None),
        ("INVALID_ARGUMENT", "a message that names no key", None),
    ],
    ids=["spec-key", "not-a-spec-key", "another-status", "no-key"],
)
def test_only_a_refused_spec_key_is_a_spec_error(code, details, key):
    import grpc

    from input_client.errors import stream_error

    error = stream_error(grpc.StatusCode[code], details)
    assert isinstance(error, input_client.StreamError)
    assert isinstance(error, input_client.SpecError) == (key is not None)
    assert getattr(error, "key", None) == key
    assert str(error) == f"{code}: {details}"


@pytest.mark.parametrize(
    "name", ["SpecError", "StreamError", "SequenceError", "ReconnectError", "ServerSpecError"]
)
def test_every_user_facing_error_names_its_public_home(name):
    cls = getattr(input_client.errors, name)
    assert cls.__module__ == "input_client.errors"
    assert issubclass(cls, input_client.InputClientError)


def test_spec_error_is_still_a_value_error():
    with pytest.raises(ValueError):
        input_client.PipelineSpec(source={"paths": []}, tokenizer={"model": "m"})
