"""The finding at full size: a 118 MB `tokenizer.json` of 4.1 M tokens (the finding's: 110 MB,
4 M; both under the 128 MB cap) against a real server in a 3 GB memory cgroup, another client's
stream flowing. Before its fastokens copy was estimated (issue 39) the first stream sat at the
cgroup's limit for 120 s and the next, with other BOS/EOS flags, got the server OOM-killed; now
the reference serves both from one loaded copy, the streams' why naming the file, its size and
tokens, the estimate and the budget. The scaled-down case is
tests/integration/test_large_tokenizer_memory.py."""

from __future__ import annotations

import sys

import pytest

from tests.support import run_bounded
from tests.support.large_tokenizer import large_model_scenario

_MIB = 1 << 20
_WRITE = """
import sys
from input_server.testing.tokenizer_models import write_large_bpe
write_large_bpe(sys.argv[1], 4_100_000)
"""


def _write_in_cgroup(folder: str) -> None:
    """Writing 4 M tokens holds ~1.5 GB of Python objects: in a cgroup of its own."""
    run_bounded([sys.executable, "-c", _WRITE, folder], gb=3)


# ~2-3 minutes on a 2-core host: writing the file, the reference loading it (~15 s), tokenizing.
@pytest.mark.timeout(600)
def test_a_110_mb_tokenizer_json_is_served_within_a_3_gb_cgroup(tmp_path, docs):
    seen = large_model_scenario(str(tmp_path), docs, _write_in_cgroup, cgroup_gb=3)
    print({k: v >> 20 if isinstance(v, int) else v for k, v in seen.items()})
    assert 100 * _MIB < seen["size"] < 128 * _MIB, seen["size"]  # under the documented cap
    for name in ("first", "second"):
        backend, why = seen[name]
        assert backend == "reference", (name, why)
        assert "fastokens would take about" in why and "MAX_LOADED_BYTES" in why, why
    # The reference's one copy (~15 x the file) on a ~0.3 GB server, whatever the flags:
    # measured 264 MB before, 2,001 MB after the first stream, the same after the second.
    assert seen["peak_second"] < 2.5 * (1 << 30), seen
    assert seen["peak_second"] - seen["peak_first"] < 300 * _MIB, seen
