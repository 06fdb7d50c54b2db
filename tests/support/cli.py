"""A CLI verb run in this process, and its mistakes: one line, exit 2."""

from __future__ import annotations


def run_main(capsys, *args: str) -> tuple[int, str]:
    """`input-server ARGS` in this process: its exit code and what it wrote to stderr."""
    from input_server import cli

    code = cli.main(list(args))
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, *needles: str) -> None:
    """Exit 2 with one `input-server: ...` line on stderr holding each needle, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("input-server: "), err
    for needle in needles:
        assert needle in lines[0], (needle, err)
