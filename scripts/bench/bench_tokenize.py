"""The tokenizer-side measurements behind docs/architecture.md "Speed", side by side in one run;
prints JSON.

  python scripts/bench/bench_tokenize.py --builtin pydoc-topics [--seq-len 1024]
  python scripts/bench/bench_tokenize.py --corpus FILE.jsonl --model SPM.model

- numpy output against lists of Python ints (flattened to one array, as a group needs);
- two Python threads encoding at once against one (does `encode` release the GIL?);
- 2 threads x 1 sentencepiece thread against 2 x 2;
- groups of 64 documents against the pipeline's group size;
- characters tokenized per epoch when long documents are cut, against the characters the kept
  tokens span (found by bisection) and the whole text;
- reading the records (JSON parsed whole, holding the GIL) against tokenizing them as the
  pipeline does (cut, in its groups), both on one thread.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time


def _rate(fn, tokens: int, seconds: float) -> float:
    """Tokens per second of `fn`, best of repeated runs for at least `seconds`."""
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        best = max(best, tokens / (time.perf_counter() - t))
    return best


def _kept_span(sp, text: str, seq_len: int) -> int:
    """Characters of `text` whose tokens are its first `seq_len` (the shortest prefix, at a
    space, that tokenizes to at least that many)."""
    if len(sp.encode(text)) <= seq_len:
        return len(text)
    spaces = [i for i, c in enumerate(text) if c == " "] + [len(text)]
    lo, hi = 0, len(spaces) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if len(sp.encode(text[: spaces[mid]])) >= seq_len:
            hi = mid
        else:
            lo = mid + 1
    return spaces[lo]


def _call_rates(sp, texts: list[str], tokens: int, group_size: int, seconds: float) -> dict:
    """Tokens a second of sentencepiece's calls: ids as ints or numpy, one or two Python
    threads (sentencepiece's own threads 1 or 2), in groups of 64 or the pipeline's size."""
    import numpy as np

    half = len(texts) // 2

    def as_ints():
        ids = sp.encode(texts)
        np.fromiter(itertools.chain.from_iterable(ids), np.int32, tokens)

    def as_numpy():
        np.concatenate(sp.encode(texts, return_type="numpy"))

    def threads(count: int, sp_threads: int):
        def go():
            parts = [texts[:half], texts[half:]] if count == 2 else [texts]
            workers = [
                threading.Thread(
                    target=sp.encode,
                    args=(p,),
                    kwargs={"return_type": "numpy", "num_threads": sp_threads},
                )
                for p in parts
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()

        return go

    def in_groups(size: int):
        return lambda: [
            sp.encode(texts[i : i + size], return_type="numpy") for i in range(0, len(texts), size)
        ]

    return {
        "ints_flattened": _rate(as_ints, tokens, seconds),
        "numpy_concatenated": _rate(as_numpy, tokens, seconds),
        "one_python_thread": _rate(threads(1, 1), tokens, seconds),
        "two_python_threads": _rate(threads(2, 1), tokens, seconds),
        "two_python_threads_x2": _rate(threads(2, 2), tokens, seconds),
        "groups_of_64": _rate(in_groups(64), tokens, seconds),
        "groups_of_pipeline_size": _rate(in_groups(group_size), tokens, seconds),
    }


def _characters_tokenized(spec, texts: list[str], group_size: int, seq_len: int) -> int:
    """The characters the tokenizer hands sentencepiece to keep `seq_len` tokens a document
    (its model wrapped to count them)."""
    from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer

    tokenized = 0

    class Counting:  # counts the characters handed to sentencepiece
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def encode(self, batch, **kwargs):
            nonlocal tokenized
            tokenized += sum(map(len, batch))
            return self.real.encode(batch, **kwargs)

    class CountingTokenizer(SentencepieceTokenizer):  # the same tokenizer, its model counted
        def model(self):
            return Counting(super().model())

    counter = CountingTokenizer(spec.tokenizer)
    counter.learn_chars_per_token(texts[:64])
    for i in range(0, len(texts), group_size):
        counter.encode(texts[i : i + group_size], trim_to=seq_len)
    return tokenized


def run(corpus: str, model: str, seq_len: int, seconds: float) -> dict:
    import sentencepiece as spm

    from input_client import PipelineSpec
    from input_server.batching.pipeline import Pipeline
    from input_server.data.sources import DocumentSource
    from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer

    spec = PipelineSpec(
        source={"paths": [corpus]}, tokenizer={"model": model}, batch={"seq_len": seq_len}
    )
    source = DocumentSource.from_spec(spec.source)
    texts = source.read_many(range(len(source)))
    sp = spm.SentencePieceProcessor(model_file=model)
    tokens = sum(map(len, sp.encode(texts)))
    group_size = Pipeline(spec).group_size
    tokenizer = SentencepieceTokenizer(spec.tokenizer)
    tokenizer.learn_chars_per_token(texts[:64])

    def tokenize_cut():
        for i in range(0, len(texts), group_size):
            tokenizer.encode(texts[i : i + group_size], trim_to=seq_len)

    read_s = 1 / _rate(lambda: source.read_many(range(len(source))), 1, seconds)
    tokenize_s = 1 / _rate(tokenize_cut, 1, seconds)
    r = _call_rates(sp, texts, tokens, group_size, seconds)
    return {
        "corpus": corpus,
        "documents": len(texts),
        "tokens": tokens,
        "seq_len": seq_len,
        "tokens_per_s": r,
        "ratios": {
            "numpy_over_ints": r["numpy_concatenated"] / r["ints_flattened"],
            "two_threads_over_one": r["two_python_threads"] / r["one_python_thread"],
            "threads_x1_over_x2": r["two_python_threads"] / r["two_python_threads_x2"],
            "pipeline_group_over_64": r["groups_of_pipeline_size"] / r["groups_of_64"],
        },
        "pipeline_group_size": group_size,
        "cut": {
            "grows_by_added_text": tokenizer.extendable,
            "characters_tokenized": _characters_tokenized(spec, texts, group_size, seq_len),
            "characters_kept_tokens_span": sum(_kept_span(sp, t, seq_len) for t in texts),
            "characters_in_all": sum(map(len, texts)),
        },
        "reading": {
            "seconds_per_epoch": read_s,
            "cut_tokenizing_seconds_per_epoch": tokenize_s,
            "over_cut_tokenizing": read_s / tokenize_s,
        },
    }


def main() -> int:
    from input_server.batching.grain_adapter import ensure_absl_flags_parsed
    from input_server.testing import corpus

    ensure_absl_flags_parsed()

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    args = parser.parse_args()
    jsonl, model = corpus.corpus_from_arguments(parser, args)
    print(json.dumps(run(jsonl, model, args.seq_len, args.seconds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
