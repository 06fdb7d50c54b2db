"""Comparing batches (a server's, a client's, the in-process pipeline's), and splitting the
documents they come from across files."""

from __future__ import annotations

from collections.abc import Sequence

from input_server.testing.reference import batch_bytes


def _same_batch(a, b) -> bool:
    """One batch against another: bytes (`batch_bytes`), a client's dict or a `Produced`."""
    import numpy as np

    from input_client.wire import FIELDS

    if isinstance(a, bytes) or isinstance(b, bytes):
        return (a if isinstance(a, bytes) else batch_bytes(getattr(a, "arrays", a))) == (
            b if isinstance(b, bytes) else batch_bytes(getattr(b, "arrays", b))
        )
    if hasattr(a, "seq") and hasattr(b, "seq") and a.seq != b.seq:
        return False
    a, b = getattr(a, "arrays", a), getattr(b, "arrays", b)
    if not sorted(a) == sorted(b) == sorted(FIELDS):
        return False
    for k in FIELDS:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def first_difference(got: Sequence, want: Sequence) -> int | None:
    """The index of the first batch that differs (or that one list lacks); None if all agree."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if not _same_batch(g, w):
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def same_batches(got: Sequence, want: Sequence) -> bool:
    """Batch for batch the same arrays (dtype, shape, bytes; and sequence numbers where known)."""
    return first_difference(got, want) is None


def assert_same_batches(got: Sequence, want: Sequence) -> None:
    """`same_batches`, failing with the first batch that differs rather than a bare False."""
    i = first_difference(got, want)
    assert i is None, (
        f"batch {i} differs from the reference (or is missing): "
        f"{len(got)} batches against {len(want)}"
    )


def split3(docs) -> list:
    """The documents in three consecutive parts (for tests of many files)."""
    k = len(docs) // 3
    return [docs[:k], docs[k : 2 * k], docs[2 * k :]]
