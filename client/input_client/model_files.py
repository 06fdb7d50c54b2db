"""Which files a tokenizer model is, and their one digest: what the server's DescribeTokenizer
reports and what a trainer compares with its own copy (`input_client.maxtext`).

A sentencepiece, tiktoken or tekken model is one file. A Hugging Face model is its `tokenizer.json`
and, where present beside it, the `tokenizer_config.json` and `special_tokens_map.json` that
name its BOS, EOS and pad tokens: another config is another tokenizer, so they are hashed too.
"""

from __future__ import annotations

import hashlib
import os

HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def hf_files(model: str) -> dict[str, str]:
    """A Hugging Face model's files that exist here, by name: `model` is the folder, or its
    `tokenizer.json` (a name ending in .json, or a regular file, as the server reads it)."""
    is_file = model.endswith(".json") or os.path.isfile(model)
    folder = os.path.dirname(model) if is_file else model
    found = {name: os.path.join(folder, name) for name in HF_FILES}
    found["tokenizer.json"] = model if is_file else found["tokenizer.json"]
    return {name: p for name, p in found.items() if os.path.isfile(p)}


def digest(files: dict[str, str]) -> str:
    """SHA-256, hex, of the model's files: one file's bytes alone (`{"": path}`), or each
    named file as its name, a NUL, its size, a NUL and its bytes, in `HF_FILES` order."""
    h = hashlib.sha256()
    for name in sorted(files, key=lambda n: HF_FILES.index(n) if n in HF_FILES else -1):
        size = os.path.getsize(files[name])
        if name:
            h.update(f"{name}\0{size}\0".encode())
        with open(files[name], "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()
