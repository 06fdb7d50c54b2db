"""One `DocumentOrder` is shared by a worker process's threads (each thread tokenizes its own
group of documents): concurrent `source_indices` across epoch boundaries must give every thread
its own epochs' indices and never raise. The permutation cache evicted with `pop(min(...))`
unguarded: two threads past the two-epoch limit popped the same epoch (KeyError, which reached
the client as INTERNAL)."""

from __future__ import annotations

import sys
import threading

import numpy as np

from input_server.data.order import DocumentOrder, permutation


def test_threads_sharing_one_order_get_their_epochs_indices_and_never_raise():
    per, threads, rounds = 97, 8, 1000
    order = DocumentOrder(
        num_records=per, shard_index=0, shard_count=1, seed=5, shuffle=True, epochs=0
    )
    expected = {e: permutation(5, e, per).astype(np.int64) for e in range(rounds + 4)}
    errors: list[BaseException] = []
    wrong: list[tuple[int, int]] = []
    start = threading.Barrier(threads)

    def work(k: int) -> None:
        start.wait()
        try:
            # Each thread walks the epochs a step apart from the others, straddling boundaries,
            # so the cache is always at its two-epoch limit and threads evict concurrently.
            for r in range(rounds):
                e = r + k % 3
                lo = e * per + (k * 13) % per
                got = order.source_indices(lo, lo + per // 2)
                e2, first = divmod(lo, per)
                want = np.concatenate([expected[e2], expected[e2 + 1]])[first : first + per // 2]
                if not np.array_equal(got, want):
                    wrong.append((k, r))
        except BaseException as exc:  # noqa: BLE001 - the assertion below reports it
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over often, where the race shows
    try:
        pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, f"{len(errors)} threads raised, first: {errors[0]!r}"
    assert not wrong, f"{len(wrong)} wrong slices, first (thread, round): {wrong[0]}"
