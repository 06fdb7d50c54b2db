"""Parquet bombs: a Parquet column is held decoded in memory, so each row group is reserved in
the process's --max-decompressed-mb (one budget with compressed JSON lines) before it is
decoded: text by what its dictionary indices decode to, ids by the footer's count of values.
A file past the budget ends its stream with RESOURCE_EXHAUSTED naming the file, the row group
and the flag, while other streams flow. The bombs here are tens of MB decoded and a few KB on
disk (one dictionary entry, or one row group that the footer names many times); the full-size
ones run in a memory cgroup (`test_hostile_data.py`)."""

from __future__ import annotations

import gc
import os
import time

import grpc
import pytest

from input_client.proto import pb
from input_server.data.parquet import ParquetReader
from input_server.data.records import DECOMPRESSED
from input_server.errors import OverBudgetError
from input_server.serving.server import Server, ServerConfig
from input_server.testing.attacks import ids_bomb, text_bomb
from tests.support import assert_still_flowing, flowing_stream, stream_status

_MIB = 1 << 20


def settled(idle: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while DECOMPRESSED.held != idle and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return DECOMPRESSED.held


def test_a_text_bomb_is_refused_before_it_is_decoded_naming_file_row_group_and_flag(tmp_path):
    """64 MiB of text in one row group of a 300-byte file, under a 16 MiB budget."""
    path = text_bomb(tmp_path / "text.parquet", rows=64)
    idle = DECOMPRESSED.held
    reader = ParquetReader(path, "text", name="bombs/text.parquet", max_decompressed=16 * _MIB)
    with pytest.raises(OverBudgetError) as e:
        reader[0]
    said = str(e.value)
    assert "bombs/text.parquet row group 0 (rows 0-63)" in said, said
    assert "--max-decompressed-mb 16" in said and "'text'" in said, said
    # The advice that helps: a column is held whole only while its file is read.
    assert "by itself" in said and "decodes to under 16 MB each" in said, said
    assert settled(idle) == idle  # nothing kept of what was refused


def test_an_ids_bomb_is_refused_at_the_row_group_past_the_budget(tmp_path):
    """16 row groups of 1 M int32 ids (3.8 MiB each, 61 MiB in all) under a 16 MiB budget: the
    fifth row group is refused before it is read, and the four read are given back."""
    path = ids_bomb(tmp_path / "ids.parquet", row_groups=16)
    idle = DECOMPRESSED.held
    reader = ParquetReader(path, "text", token_field="ids", max_decompressed=16 * _MIB)
    assert len(reader) == 16 * 500
    with pytest.raises(OverBudgetError) as e:
        reader[0]
    said = str(e.value)
    assert "row group 4 (rows 2000-2499)" in said and "--max-decompressed-mb 16" in said, said
    assert settled(idle) == idle


def test_a_column_is_given_back_for_another_unless_it_is_being_read(tmp_path):
    """A loaded column holds about its decoded size in the budget; another file's column that
    does not fit beside it takes its place (the first is given back, and read again it loads
    again, the same rows); only while the first is being read is the second refused, naming
    what is held. (Before: held until closed, so every file ever read counted at once.)"""
    path = ids_bomb(tmp_path / "ids.parquet", row_groups=2)  # 7.6 MiB of ids
    text = text_bomb(tmp_path / "text.parquet", rows=6)  # 6 MiB of text
    idle = DECOMPRESSED.held
    ids = ParquetReader(path, "text", token_field="ids", max_decompressed=12 * _MIB)
    assert ids[999].tolist() == [7] * 2000
    assert 7.6 * _MIB <= DECOMPRESSED.held - idle < 8 * _MIB
    texts = ParquetReader(text, "text", max_decompressed=12 * _MIB)
    assert texts.read_many([5, 0]) == [texts[5], texts[0]] and texts[0].startswith("all work")
    assert 6 * _MIB <= DECOMPRESSED.held - idle < 7 * _MIB  # the ids were given back
    assert ids.read_many([0, 999])[1].tolist() == [7] * 2000  # loaded again, texts given back
    with ids._loaded():  # a stream reading the ids at this moment
        with pytest.raises(OverBudgetError, match="held now that cannot be given back yet") as e:
            texts[0]
        assert "text.parquet row group 0" in str(e.value), e.value
    assert texts[1].startswith("all work")
    ids.close()
    texts.close()
    assert settled(idle) == idle


def call(target: str, spec: pb.PipelineSpec) -> tuple[grpc.StatusCode, str]:
    """(status, details) of a raw request; OK once its first message came."""
    return stream_status(target, spec, take=1)[:2]


def test_a_parquet_bomb_ends_its_stream_resource_exhausted_while_another_flows(tmp_path, make_spec):
    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"], max_decompressed_mb=16, max_workers=2, grace_s=1
    )
    text = text_bomb(tmp_path / "text.parquet", rows=64)
    ids = ids_bomb(tmp_path / "ids.parquet", row_groups=16)
    with Server(config) as srv:
        target = srv.targets[0]
        other = make_spec(order={"epochs": 0}).to_proto()
        with flowing_stream(target, other, started=1) as flowing:
            for spec in (
                make_spec(source={"paths": [text], "format": "parquet"}),
                make_spec(source={"paths": [ids], "format": "parquet", "token_field": "ids"}),
            ):
                code, details = call(target, spec.to_proto())
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
                assert "row group" in details and "--max-decompressed-mb 16" in details, details
                assert ".parquet" in details, details
            assert_still_flowing(flowing, 0.5)


_PEAK = """
import resource, sys
from input_server.data.parquet import ParquetReader
reader = ParquetReader(sys.argv[1], "text", token_field="ids", max_decompressed=1 << 30)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert reader[0].tolist() == [7] * 2000 and reader[15_999].tolist() == [7] * 2000
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def test_an_ids_column_of_many_row_groups_peaks_at_about_its_size(tmp_path):
    """What --max-decompressed-mb reserves is the column: joining its row groups must not hold
    it twice (283 MiB for a 122 MiB column: every row group, then their concatenation; now
    ~150: the column and a row group)."""
    import subprocess
    import sys

    path = ids_bomb(tmp_path / "ids.parquet", row_groups=32)  # 122 MiB of int32 ids
    import input_server

    checkout = os.path.dirname(os.path.dirname(input_server.__file__))  # the code under test
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, path],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": checkout},
    )
    peak_mib = float(out.stdout.strip())
    assert peak_mib < 122 * 1.4, peak_mib
