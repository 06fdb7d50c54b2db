"""Parquet page headers read before the pages (`parquet_pages`): they agree with the footer on
real files of every encoding and codec, a damaged header is a CorruptFileError naming the file,
and a row group with a page of one document past --max-document-mb is refused by its headers
while a long value among shorter ones is refused by its row, the others readable."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from input_server.data.parquet import ParquetReader
from input_server.data.parquet_pages import chunk_pages
from input_server.errors import CorruptFileError, InvalidSpecError


def _pages(path):
    meta = pq.ParquetFile(path).metadata
    out = []
    with open(path, "rb") as f:
        for g in range(meta.num_row_groups):
            c = meta.row_group(g).column(0)
            first = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
            out.append((c, chunk_pages(f, first, c.total_compressed_size, "x.parquet")))
    return out


@pytest.mark.parametrize("codec", ["none", "zstd", "brotli", "gzip", "snappy"])
@pytest.mark.parametrize("dictionary", [True, False], ids=["dictionary", "plain"])
@pytest.mark.parametrize("version", ["1.0", "2.0"], ids=["data-v1", "data-v2"])
def test_page_headers_agree_with_the_footer(tmp_path, codec, dictionary, version):
    texts = [f"document {i} " * (i % 50) for i in range(5000)]
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"text": texts}),
        path,
        compression=codec,
        use_dictionary=dictionary,
        data_page_version=version,
        row_group_size=2000,
        data_page_size=4096,
        write_batch_size=100,
    )
    for chunk, pages in _pages(path):
        assert len(pages) > 1
        assert sum(p.compressed for p in pages) <= chunk.total_compressed_size
        assert sum(p.uncompressed for p in pages) <= chunk.total_uncompressed_size
        # The footer's sizes count each header too (with its statistics: up to 4 KiB each
        # for min and max).
        unheaded = chunk.total_uncompressed_size - sum(p.uncompressed for p in pages)
        assert unheaded < (8 << 10) * len(pages)
        data = [p for p in pages if p.kind != 2]
        assert sum(p.values for p in data) == chunk.num_values


def test_a_damaged_page_header_names_the_file(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), path)
    ((chunk, _),) = _pages(path)
    raw = bytearray(path.read_bytes())
    first = chunk.dictionary_page_offset or chunk.data_page_offset
    raw[first : first + 8] = b"\xff" * 8
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError, match="x.parquet: a page header at byte"):
        _pages(path)


@pytest.mark.parametrize("dictionary", [True, False], ids=["dictionary", "plain"])
def test_one_huge_cell_is_refused_by_its_page_and_one_among_others_by_its_row(tmp_path, dictionary):
    alone, among = tmp_path / "alone.parquet", tmp_path / "among.parquet"
    big = "all work " * ((3 << 20) // 9)  # 3 MB, past a 1 MB limit
    pq.write_table(pa.table({"text": [big]}), alone, compression="zstd", use_dictionary=dictionary)
    texts = [f"small {i}" for i in range(3000)]
    texts[7] = big
    pq.write_table(pa.table({"text": texts}), among, compression="zstd", use_dictionary=dictionary)
    reader = ParquetReader(str(alone), "text", name="alone.parquet", max_decompressed=1 << 30)
    reader.max_bytes = 1 << 20
    with pytest.raises(InvalidSpecError, match=r"row group 0 \(rows 0-0\).*page headers") as e:
        reader[0]
    assert "--max-document-mb 1" in str(e.value)
    reader = ParquetReader(str(among), "text", name="among.parquet", max_decompressed=1 << 30)
    reader.max_bytes = 1 << 20
    assert reader.read_many([1, 2]) == ["small 1", "small 2"]
    for read in (lambda: reader[7], lambda: reader.read_many([3, 7])):
        with pytest.raises(InvalidSpecError, match=r"among.parquet row 7: the document is 3.0 MB"):
            read()
