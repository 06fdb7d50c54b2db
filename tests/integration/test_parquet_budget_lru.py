"""--max-decompressed-mb bounds the Parquet columns a server holds at once, not every file it
has read: a corpus of Parquet files each within the budget, but past it together, streams
whole (columns not being read are given back, least recently used first, and load again
the same when read again). Before, each column stayed reserved until its reader closed, so
opening such a source (which reads every file's first record) was refused."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from input_client import InputClient, PipelineSpec
from input_server.serving.server import Server, ServerConfig
from tests.support import assert_same_batches, run_pipeline

_FILES, _ROWS, _IDS = 3, 150, 3000  # 450 K int32 ids a file: ~1.7 MiB decoded, 5.2 in all


def _corpus(d) -> list[str]:
    """Pre-tokenized files whose rows differ (ids 3-999 of the model's vocabulary)."""
    rng = np.random.default_rng(7)
    paths = []
    for f in range(_FILES):
        ids = rng.integers(3, 1000, size=(_ROWS, _IDS), dtype=np.int32)
        offsets = np.arange(0, _ROWS * _IDS + 1, _IDS, dtype=np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids.reshape(-1)))
        path = os.path.join(d, f"part-{f}.parquet")
        pq.write_table(pa.table({"ids": column}), path, row_group_size=50)
        paths.append(path)
    return paths


def test_parquet_files_past_the_budget_together_stream_whole_and_the_same(tmp_path, spm_model):
    paths = _corpus(tmp_path)
    spec = PipelineSpec(
        source={"paths": paths, "format": "parquet", "token_field": "ids"},
        tokenizer={"model": spm_model},
        batch={"seq_len": 1024, "size": 8},
        order={"seed": 11, "epochs": 1},
        workers={"count": 0},
    )
    want = [p.arrays for p in run_pipeline(spec)]  # no budget: every column held at once
    assert len(want) > 40
    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"], max_decompressed_mb=4, max_workers=2, grace_s=1
    )
    with Server(config) as srv, InputClient(srv.targets[0], connect_timeout_s=10) as client:
        got = list(client.batches(spec))
        again = list(client.batches(spec))  # a second stream over the same files
    assert_same_batches(got, want)  # every document once, in the same order
    assert_same_batches(again, want)


def test_a_column_past_the_budget_by_itself_is_refused_without_emptying_the_others(tmp_path):
    """A row group larger than the whole budget is refused by name before anything is given
    back: the columns held for other streams stay loaded (no reload storm for nothing)."""
    from input_server.data.parquet import ParquetReader
    from input_server.data.records import DECOMPRESSED
    from input_server.errors import OverBudgetError
    from input_server.testing.attacks import text_bomb

    small = _corpus(tmp_path)[0]  # ~1.7 MiB
    big = text_bomb(tmp_path / "big.parquet", rows=8)  # 8 MiB in one row group
    limit = 4 << 20
    held = ParquetReader(small, "text", token_field="ids", max_decompressed=limit)
    bomb = ParquetReader(big, "text", name="big.parquet", max_decompressed=limit)
    try:
        first = held[0].copy()
        before = DECOMPRESSED.held
        try:
            bomb[0]
            raise AssertionError("an 8 MiB row group was read under a 4 MiB budget")
        except OverBudgetError as e:
            assert "big.parquet row group 0" in str(e) and "by itself" in str(e), e
        assert DECOMPRESSED.held == before  # the other column was not given back
        assert (held[0] == first).all()
    finally:
        held.close()
        bomb.close()


def test_a_source_kept_open_does_not_hold_its_columns_against_another(tmp_path):
    """A named pipeline keeps its source open for the server's life: its Parquet columns,
    loaded when it opened (each file's first record is checked), are given back when another
    source needs the room, and read again the same. Before, they stayed reserved until the
    pipeline closed, so the second source was refused at open."""
    from input_client.spec import SourceSpec
    from input_server.data.roots import DataAccess
    from input_server.data.sources import DocumentSource

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    access = DataAccess(max_decompressed_bytes=4 << 20)

    def source(d):
        spec = SourceSpec(paths=tuple(_corpus(d)), format="parquet", token_field="ids")
        return DocumentSource.from_spec(spec, access)

    kept = source(first)  # 5.2 MiB of columns in all: the earliest already given back
    row = kept[0].copy()
    other = source(second)
    try:
        assert len(other) == _FILES * _ROWS
        assert (kept[0] == row).all()  # loaded again, the same ids
    finally:
        kept.close()
        other.close()
