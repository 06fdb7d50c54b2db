#!/usr/bin/env bash
# Writes ./.tpu-kit (git-ignored via .git/info/exclude): what the TPU host's runs read besides the
# project: corpus.jsonl (the standard library's docstrings and pydoc's topics, 7,414 documents of
# real prose under Python 3.11) and MaxText 0.2.5's own tokenizer.llama2 (sentencepiece BPE, 32k)
# and tokenizer_llama3.tiktoken, taken from MaxText's PyPI wheel.
# usage (from the project root, the project installed): bash scripts/tpu/kit.sh [MAXTEXT_WHEEL]
set -euo pipefail
grep -qx '/.tpu-kit/' .git/info/exclude 2>/dev/null || echo '/.tpu-kit/' >> .git/info/exclude
mkdir -p .tpu-kit
wheel="${1:-}"
if [[ -z "$wheel" ]]; then
  mkdir -p /tmp/maxtext-wheel
  python3 -m pip download -q --no-deps --only-binary=:all: -d /tmp/maxtext-wheel maxtext==0.2.5
  wheel="$(ls /tmp/maxtext-wheel/maxtext-0.2.5-*.whl | head -1)"
fi
python3 - "$wheel" <<'PY'
import sys, zipfile
from input_server.data import builtin_corpora as corpora

docs = corpora.stdlib_docstrings() + corpora.pydoc_topics()
corpora.write_jsonl(docs, ".tpu-kit/corpus.jsonl")
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in ("tokenizer.llama2", "tokenizer_llama3.tiktoken"):
        with open(f".tpu-kit/{name}", "wb") as f:
            f.write(wheel.read(f"maxtext/assets/tokenizers/{name}"))
print(f"kit: {len(docs)} documents, {sum(map(len, docs)):,} characters; both tokenizers", file=sys.stderr)
PY
