"""Document readers without a pipeline: random access over many files in every format,
pickling (Grain ships readers to its worker processes), and compressed files' share of the
process's --max-decompressed-mb."""

from __future__ import annotations

import gc
import gzip
import json
import pickle
import random
import shutil

import pytest

from input_client.spec import SourceSpec
from input_server.data.array_record import ArrayRecordReader
from input_server.data.jsonl import JsonlReader
from input_server.data.parquet import ParquetReader
from input_server.data.records import DECOMPRESSED
from input_server.data.sources import DocumentSource, open_reader
from input_server.data.tfrecord import TFRecordReader
from input_server.errors import OverBudgetError, RecordError
from tests.support import FORMATS, jsonl_bytes, split3, write_bytes, write_format

# ---------------------------------------------------------------------------------------------
# 1. Random access


@pytest.mark.parametrize("kind", list(FORMATS))
def test_document_source_random_access_over_three_files(kind, some_docs, tmp_path):
    """len = records in all files; source[i] = doc i in any access order; where() names it."""
    parts = split3(some_docs)
    paths = []
    for i, part in enumerate(parts):
        path, source = write_format(kind, part, tmp_path / f"part-{i}")
        paths.append(path)
    keys = {k: v for k, v in source.items() if k != "paths"}
    src = DocumentSource.from_spec(SourceSpec(paths=tuple(paths), **keys))
    assert len(src) == len(some_docs)
    order = list(range(len(src)))
    random.Random(0).shuffle(order)
    assert {i: src[i] for i in order} == dict(enumerate(some_docs))
    first_of_last = len(parts[0]) + len(parts[1])
    assert src.where(0).startswith(paths[0] + " ")
    assert src.where(first_of_last).startswith(paths[2] + " ")
    assert src.where(first_of_last - 1).startswith(paths[1] + " ")
    last = len(parts[2]) - 1
    unit = {
        "jsonl": f"line {last + 1}",
        "arrayrecord": f"record {last}",
        "tfrecord": f"record {last}",
        "parquet": f"row {last}",
    }[keys.get("format", "jsonl")]
    assert src.where(len(src) - 1) == f"{paths[2]} {unit}"


# ---------------------------------------------------------------------------------------------
# 2. Pickling (Grain ships readers to worker processes)


@pytest.mark.parametrize("kind", list(FORMATS))
def test_used_reader_pickles_and_reads_every_record(kind, some_docs, tmp_path):
    """A reader that has already read (open handles, buffers) pickles and reads all records."""
    path, source = write_format(kind, some_docs, tmp_path)
    spec = SourceSpec(**{**source, "paths": (path,)})
    reader = open_reader(path, spec)
    assert isinstance(reader, (JsonlReader, ArrayRecordReader, ParquetReader, TFRecordReader))
    assert reader[len(reader) - 1] == some_docs[-1]  # opens the file / fills the buffers
    copy = pickle.loads(pickle.dumps(reader))
    assert len(copy) == len(some_docs)
    assert [copy[i] for i in range(len(copy))] == some_docs
    assert reader[0] == some_docs[0]  # the original still reads after being pickled


def test_gz_reader_pickle_omits_the_decompressed_buffer(some_docs, tmp_path):
    """The pickle of a used .gz reader holds the line index, not the decompressed text."""
    data = jsonl_bytes(some_docs)
    path = write_bytes(tmp_path / "d.jsonl.gz", gzip.compress(data))
    reader = JsonlReader(path, "text")
    assert reader[5] == some_docs[5]
    blob = pickle.dumps(reader)
    assert len(blob) < len(data) / 5, (len(blob), len(data))
    assert json.dumps(some_docs[5])[1:60].encode() not in blob
    assert [pickle.loads(blob)[i] for i in range(len(some_docs))] == some_docs


def test_document_source_pickles_with_all_its_readers(some_docs, tmp_path):
    """The chained source round-trips through pickle and reads the same documents."""
    path, _ = write_format("jsonl-zst-multiframe", some_docs, tmp_path)
    second = shutil.copy(path, tmp_path / "second.jsonl.zst")  # one file twice is refused
    src = DocumentSource.from_spec(SourceSpec(paths=(path, str(second))))
    copy = pickle.loads(pickle.dumps(src))
    assert len(copy) == 2 * len(some_docs)
    assert [copy[i] for i in range(len(copy))] == some_docs + some_docs
    assert copy.where(len(some_docs)) == f"{second} line 1"


# ---------------------------------------------------------------------------------------------
# 3. Compressed files: the process's budget, and a file that changed


def zst(path, data: bytes) -> str:
    import zstandard

    return write_bytes(path, zstandard.ZstdCompressor().compress(data))


def test_a_readers_close_gives_its_bytes_back_to_the_process_budget(some_docs, tmp_path):
    """Reserved while decompressed, kept through `release` (descriptors only), given back by
    `close`, reserved again by a read after it, and given back when the reader is collected;
    a pickled copy holds nothing until it reads."""
    data = jsonl_bytes(some_docs)
    path = zst(tmp_path / "d.jsonl.zst", data)
    gc.collect()
    idle = DECOMPRESSED.held
    reader = JsonlReader(path, "text", max_decompressed=64 << 20)
    assert DECOMPRESSED.held == idle + len(data) == idle + reader.decompressed_bytes
    reader.release()
    assert reader[3] == some_docs[3] and DECOMPRESSED.held == idle + len(data)
    reader.close()
    assert DECOMPRESSED.held == idle
    reader.close()  # twice: nothing given back twice
    assert DECOMPRESSED.held == idle
    copy = pickle.loads(pickle.dumps(reader))
    assert DECOMPRESSED.held == idle
    assert reader[3] == some_docs[3] and copy[4] == some_docs[4]  # both decompress again
    assert DECOMPRESSED.held == idle + 2 * len(data)
    del reader, copy
    gc.collect()
    assert DECOMPRESSED.held == idle


def test_readers_together_stay_within_the_bound(some_docs, tmp_path):
    """Two readers of one file each fit the bound alone, not together (the bound is the
    process's, not the reader's); the refused one holds nothing."""
    data = jsonl_bytes(some_docs)
    path = zst(tmp_path / "d.jsonl.zst", data)
    gc.collect()
    idle = DECOMPRESSED.held
    bound = idle + len(data) * 3 // 2
    first = JsonlReader(path, "text", max_decompressed=bound)
    with pytest.raises(OverBudgetError, match=r"held now.*--max-decompressed-mb"):
        JsonlReader(path, "text", max_decompressed=bound)
    assert DECOMPRESSED.held == idle + len(data)
    first.close()
    JsonlReader(path, "text", max_decompressed=bound).close()
    assert DECOMPRESSED.held == idle


@pytest.mark.parametrize("change", ["grew", "shrank"])
def test_a_compressed_file_that_changed_since_it_was_opened_is_a_record_error(
    change, some_docs, tmp_path
):
    """Decompressed again after `close` (or in a worker process) and of another size: the file
    changed, DATA_LOSS naming it, not a bound it would exceed."""
    data = jsonl_bytes(some_docs[:100])
    path = zst(tmp_path / "d.jsonl.zst", data)
    reader = JsonlReader(path, "text", max_decompressed=64 << 20)
    reader.close()
    zst(tmp_path / "d.jsonl.zst", data * 2 if change == "grew" else data[: len(data) // 2])
    with pytest.raises(RecordError, match="changed since the stream opened it"):
        reader[0]
    copy = pickle.loads(pickle.dumps(reader))
    with pytest.raises(RecordError, match="changed since the stream opened it"):
        copy[0]
