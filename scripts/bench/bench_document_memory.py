"""The memory a tokenizer kind takes for each character of one long document it tokenizes whole:
the figures behind `input_server.data.tokenizers.memory.BYTES_PER_CHAR`.

Each (kind, text, backend) runs in a process of its own: a model trained on the standard
library's docstrings, one document of N characters (`a`, NUL, CJK, base64, prose) made, the
peak resident memory read before and after it is tokenized. Prints one JSON line a run, then
the most bytes a character of each kind.

    python3 scripts/bench/bench_document_memory.py [--chars 2000000] [--kinds tekken,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_ONE = r"""
import base64, json, os, resource, sys
import numpy as np
import psutil
from input_client.spec import TokenizerSpec
from input_server.data.tokenizers.registry import load_tokenizer

kind, model, text, backend, n = sys.argv[1:5] + [int(sys.argv[5])]
tok = load_tokenizer(TokenizerSpec(kind=kind, model=model, backend=backend))
tok.choose_backend(["a warm-up document of a few words"] * 4)
tok.encode(["a warm-up document of a few words " * 100])
if text == "a":
    t = "a" * n
elif text == "nul":
    t = "\0" * n
elif text == "cjk":
    codes = np.arange(n, dtype=np.uint32) * 7919 % 20000 + 0x4E00
    t = codes.astype("<u4").tobytes().decode("utf-32-le")
elif text == "base64":
    t = base64.b64encode(os.urandom(n * 3 // 4)).decode()
else:
    t = "the cat sat on a mat " * (n // 21)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
now = psutil.Process().memory_info().rss
group = tok.encode([t])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({
    "kind": kind, "model": os.path.basename(model), "text": text,
    "backend": tok.choice.backend, "chars": len(t), "tokens": int(group.tokens.size),
    "bytes_per_char": round((after - max(peak, now)) / len(t), 1),
}))
"""


def _models(folder: str) -> dict[str, list[str]]:
    from input_server.data.builtin_corpora import stdlib_docstrings
    from input_server.data.tokenizers.trainers import (
        train_hf_tokenizer,
        train_sentencepiece,
        write_tekken_model,
        write_tiktoken_model,
    )

    docs = stdlib_docstrings(3000)
    bpe = dict(model_type="bpe", keep_whitespace=True, byte_fallback=True, with_pad=False)
    return {
        "sentencepiece": [
            train_sentencepiece(docs, os.path.join(folder, "unigram"), vocab_size=2000),
            train_sentencepiece(
                docs, os.path.join(folder, "bpe"), vocab_size=2000, normalization="identity", **bpe
            ),
        ],
        "huggingface": [train_hf_tokenizer(docs, os.path.join(folder, "hf"), vocab_size=2000)],
        "tiktoken": [
            write_tiktoken_model(docs, os.path.join(folder, "t.tiktoken"), vocab_size=2000)
        ],
        "tekken": [write_tekken_model(docs, os.path.join(folder, "tekken.json"), vocab_size=2000)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=2_000_000)
    parser.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    args = parser.parse_args()
    most: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        for kind, models in _models(folder).items():
            if args.kinds and kind not in args.kinds.split(","):
                continue
            for model in models:
                for text in ("a", "nul", "cjk", "base64", "prose"):
                    for backend in ("reference", "auto"):
                        argv = [kind, model, text, backend, str(args.chars)]
                        out = subprocess.run(
                            [sys.executable, "-c", _ONE, *argv], capture_output=True, text=True
                        )
                        if out.returncode:
                            print(json.dumps({"run": argv, "error": out.stderr[-300:]}))
                            continue
                        line = json.loads(out.stdout.strip().splitlines()[-1])
                        print(json.dumps(line), flush=True)
                        most[kind] = max(most.get(kind, 0.0), line["bytes_per_char"])
    print(json.dumps({"most_bytes_per_char": most}))


if __name__ == "__main__":
    main()
