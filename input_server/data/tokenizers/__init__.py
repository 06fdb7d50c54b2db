"""Tokenizers of every `tokenizer.kind` behind one interface (`Tokenizer`): sentencepiece,
Hugging Face `tokenizers`, tiktoken, and Mistral's tekken (run by tiktoken).

Every kind encodes a group of documents on the calling thread with its library's fastest calls,
which release the GIL (so Grain's threads and the tuner work alike for all): one batch call a
group for sentencepiece and Hugging Face, one Rust call a document for tiktoken and tekken
(tiktoken has no batch call but a Python thread pool). Each adds BOS/EOS as MaxText's tokenizer
class of that kind adds them (tekken: as mistral-common's `Tekkenizer`), and reports its
special ids as `IdsInfo` (what `DescribeTokenizer` answers and what pre-tokenized ids are
checked against).
"""

from __future__ import annotations

from input_server.data.tokenizers.base import IdsInfo, ModelTokenizer, Specials, Tokenizer
from input_server.data.tokenizers.groups import TokenGroup
from input_server.data.tokenizers.registry import (
    KINDS,
    load_tokenizer,
    open_tokenizer,
    resolve_model,
)

__all__ = [
    "IdsInfo",
    "KINDS",
    "ModelTokenizer",
    "Specials",
    "TokenGroup",
    "Tokenizer",
    "load_tokenizer",
    "open_tokenizer",
    "resolve_model",
]
