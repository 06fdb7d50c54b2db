"""Benchmark: whether loading fastokens from a derived tokenizer.json holds the GIL.

    python scripts/bench/bench_backend_load_gil.py RANKS.tiktoken

A Python thread ticks every millisecond while this process derives the tokenizer.json from
tiktoken ranks (`fast.ranks_as_tokenizer_json`, Python) and then loads it into fastokens
(`from_json_str`, Rust); the longest gap between two ticks during each says how long that step
kept other Python threads (a stream's reference groups) from running. Printed as JSON.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time

from input_server.data.tokenizers import fast
from input_server.data.tokenizers.tiktoken import PATTERN, read_ranks
from input_server.testing.results import emit_json


def main(path: str) -> None:
    import fastokens

    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    def longest_gap(start: float, end: float) -> float:
        inside = [t for t in ticks if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(inside)), default=end - start)

    ranks = read_ranks(path, path)
    threading.Thread(target=tick, daemon=True).start()
    t0 = time.perf_counter()
    derived = fast.ranks_as_tokenizer_json(ranks, PATTERN, path)
    t1 = time.perf_counter()
    fastokens.Tokenizer.from_json_str(derived)
    t2 = time.perf_counter()
    stop.set()
    emit_json(
        {
            "model": path,
            "derive_s": round(t1 - t0, 3),
            "derive_longest_tick_gap_s": round(longest_gap(t0, t1), 4),
            "from_json_str_s": round(t2 - t1, 3),
            "from_json_str_longest_tick_gap_s": round(longest_gap(t1, t2), 4),
        }
    )


if __name__ == "__main__":
    main(sys.argv[1])
