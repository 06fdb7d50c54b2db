"""The thread counts `bench` tries its limit at: powers of two below the cores, and the cores."""

from __future__ import annotations

import pytest

from input_server.benchmark.kinds import limit_threads


@pytest.mark.parametrize(
    "cores, counts",
    [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (13, [1, 2, 4, 8, 13])],
)
def test_limit_threads(cores, counts):
    assert limit_threads(cores) == counts
