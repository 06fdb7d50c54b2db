"""One oversized Parquet cell against a real server in a 2 GB memory cgroup: an 803-byte file
holding one 381 MB text cell (brotli) is refused from its page headers before a page is read,
naming the file, the row group, the size and --max-document-mb, while another client's stream flows.

Measured before (issue 39): a 643-byte file of one 381 MB cell took a server from 404 MB to
2,152 MB before --max-document-mb refused the row (a 2 GB pod dies). Only inside a cgroup;
skipped where none can be made.
"""

from __future__ import annotations

import os
import sys

import grpc
import pytest

from input_client import InputClient, StreamError
from tests.support import (
    assert_peak_within,
    assert_still_flowing,
    bounded_server,
    flowing_stream,
    needs_memory_cgroup,
    other_stream_spec,
    run_bounded,
)

_MIB = 1 << 20
# One 381 MB cell of one repeated byte, plain-encoded and brotli-compressed: 803 bytes on disk.
# Written in a child process inside a cgroup: pyarrow holds ~1.25 GB while writing it.
_WRITE = """
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
n = 381 << 20
data = pa.py_buffer(np.full(n, ord("a"), np.uint8))
cell = pa.StringArray.from_buffers(1, pa.py_buffer(np.array([0, n], np.int32)), data)
pq.write_table(pa.table({"text": cell}), sys.argv[1], compression="brotli",
               use_dictionary=False, store_schema=False, write_statistics=False)
"""


# ~15 s on a 2-core host (4 s of it writing the file).
@pytest.mark.timeout(180)
def test_a_tiny_file_of_one_huge_cell_is_refused_from_its_page_headers(tmp_path, docs):
    needs_memory_cgroup("a 381 MB cell needs one")
    root = str(tmp_path)
    cell = os.path.join(root, "cell.parquet")
    run_bounded([sys.executable, "-c", _WRITE, cell], gb=2)
    assert os.path.getsize(cell) < 4096
    good = other_stream_spec(docs, tmp_path)
    with (
        bounded_server(root, gb=2, log=os.path.join(root, "server.log")) as server,
        flowing_stream(server.target, good.to_proto(), timeout=600, started=5) as flowing,
    ):
        before = server.peak.bytes
        spec = good.replace(source={"paths": [cell], "format": "parquet"})
        with InputClient(server.target) as c, pytest.raises(StreamError) as e:
            with c.batches(spec) as it:
                next(it)
        said = e.value.details
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, said
        for needle in ("cell.parquet row group 0", "381.0 MB", "--max-document-mb 64"):
            assert needle in said, (needle, said)
        assert "page headers" in said, said
        assert server.process.poll() is None, "the server died"
        assert_still_flowing(flowing)
        # Refused before a byte of the cell is decompressed (measured: +0 MB over the
        # flowing stream's server, was +1,748 MB).
        peak = assert_peak_within(server, before, 100)
    print(f"peak {before >> 20} MB before the request, {peak >> 20} MB after")
