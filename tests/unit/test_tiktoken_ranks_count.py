"""The ranks file's lines counted before it is parsed (`_filled_lines`): the same count as the
lines `read_ranks` parses, whatever the chunk size cuts through."""

from __future__ import annotations

import base64

import pytest

from input_server.data.tokenizers import tiktoken as tt
from input_server.errors import InvalidSpecError


def _rank_line(r: int) -> bytes:
    return base64.b64encode(r.to_bytes(3, "big")) + b" %d" % r


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
@pytest.mark.parametrize(
    "body, filled",
    [
        (b"", 0),
        (b"\n\n \t\n", 0),
        (b"YQ== 0", 1),
        (b"YQ== 0\n", 1),
        (b"\n\nYQ== 0\n \n", 1),
        (b"YQ== 0\r\n\r\nYg== 1\n  Yw== 2", 3),
    ],
)
def test_filled_lines_count_what_the_parser_parses(tmp_path, body, filled, chunk):
    path = tmp_path / "ranks.tiktoken"
    path.write_bytes(body)
    assert tt._filled_lines(str(path), chunk_bytes=chunk) == filled
    if filled:
        assert len(tt.read_ranks(str(path), "ranks")) == filled


def test_one_rank_past_the_cap_is_refused_before_any_is_parsed(tmp_path, monkeypatch):
    monkeypatch.setattr(tt, "MAX_RANKS", 5)
    path = tmp_path / "many.tiktoken"
    # The first line would stop the parser as not a rank line: the count refuses first.
    path.write_bytes(b"\n".join([b"not a rank line"] + [_rank_line(r) for r in range(5)]))
    with pytest.raises(InvalidSpecError, match="more than 5 ranks"):
        tt.read_ranks(str(path), "many")
    path.write_bytes(b"\n".join([_rank_line(r) for r in range(5)] + [b"   "]))
    assert len(tt.read_ranks(str(path), "many")) == 5


def test_a_line_past_the_line_cap_stops_the_count_and_is_refused_by_number(tmp_path):
    path = tmp_path / "line.tiktoken"
    path.write_bytes(_rank_line(0) + b"\n" + b"QUFB" * 4096)  # 16 KB, no newline
    assert tt._filled_lines(str(path), chunk_bytes=1000) == 2
    with pytest.raises(InvalidSpecError, match="line 2 is longer than"):
        tt.read_ranks(str(path), "line")
