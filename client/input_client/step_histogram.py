"""Percentiles of step times: exact over a sorted list, or from a histogram whose buckets grow by
a fixed ratio, within `PERCENTILE_ACCURACY` of the exact figure in memory that grows with the
spread of the times, not their count."""

from __future__ import annotations

import math
from collections.abc import Mapping

# The relative width of a bucket: each percentile read from the histogram is within this share
# of the exact one, and a run's buckets stay few, as step times cluster.
PERCENTILE_ACCURACY = 0.005
_GAMMA = (1 + PERCENTILE_ACCURACY) / (1 - PERCENTILE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
# Below every bucket a positive float falls in: the steps that took no time at all.
_ZERO_BUCKET = -(1 << 62)


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without importing numpy.

    Args:
      sorted_values: the values, ascending; at least one.
      q: the percentile, 0 to 100.
    """
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bucket(seconds: float) -> int:
    """The histogram bucket of a step time: bucket i holds (gamma^(i-1), gamma^i]."""
    return math.ceil(math.log(seconds) / _LOG_GAMMA) if seconds > 0 else _ZERO_BUCKET


def _bucket_value(b: int) -> float:
    """The value a bucket stands for: the one within `PERCENTILE_ACCURACY` of all it holds."""
    return 0.0 if b == _ZERO_BUCKET else 2 * _GAMMA**b / (_GAMMA + 1)


def histogram_percentile(counts: Mapping[int, int], q: float) -> float:
    """`percentile` of the step times a histogram holds, each by its bucket's value.

    Args:
      counts: how many step times each `bucket` holds; at least one in all.
      q: the percentile, 0 to 100.
    """
    total = sum(counts.values())
    pos = (total - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, total - 1)
    low = high = None
    seen = 0
    for b in sorted(counts):
        seen += counts[b]
        if low is None and lo < seen:
            low = _bucket_value(b)
        if hi < seen:  # at or after `lo`'s bucket: both found
            high = _bucket_value(b)
            break
    return low + (high - low) * (pos - lo)
