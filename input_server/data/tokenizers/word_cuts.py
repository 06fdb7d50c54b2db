"""Where a byte-level BPE `tokenizer.json` may be cut before tokenizing with the same ids: at a
space between two letters, for the pre-tokenizers whose split there is proved below.

The proof, for GPT-2's, Llama 3's and Qwen's split patterns (`PATTERNS`): every alternative that
matches a letter ends at a non-letter or earlier (`\\p{L}+`, with at most one non-letter before
it, or a contraction), and none spans a letter then a space; so the match that holds the letter
before the space ends at the space, and the next match starts there, whatever follows. No
alternative looks behind. The text before the cut then splits into the same pieces as it does
inside the whole text, and so does the text from the cut to any later such space; BPE encodes
each piece alone. Around it:
- no normalizer, or NFC: a space never composes with what is before or after it (it has no
  canonical composition), so NFC of the parts is NFC of the whole;
- added tokens (found in the text before splitting) hold no whitespace and neither strip
  spaces beside them nor ask for a whole word, so none spans or moves the space;
- BPE without dropout (dropout is random), the pieces turned to bytes alone (`ByteLevel` with
  no prefix space: a prefix space would be added to a part but not inside the whole).
Anything else: no cut (the document is tokenized whole, then trimmed).
"""

from __future__ import annotations

import json
import re

from input_server.data.tokenizers.tiktoken import PATTERN as LLAMA3_PATTERN

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
PATTERNS = frozenset({GPT2_PATTERN, LLAMA3_PATTERN, QWEN_PATTERN})


# Every space `between_letters` allows, and a few more (`[^\W\d_]` takes numerals that are
# not digits too): what `groups.Cutter.longest_uncut` filters with it.
LETTER_SPACES = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")


def between_letters(text: str, space: int) -> bool:
    """Whether the space at `space` has a letter (`\\p{L}`: `str.isalpha`) on each side."""
    return 0 < space < len(text) - 1 and text[space - 1].isalpha() and text[space + 1].isalpha()


def _byte_level(p: dict, *, use_regex: bool) -> bool:
    return (
        p.get("type") == "ByteLevel"
        and not p.get("add_prefix_space", False)
        and bool(p.get("use_regex", True)) == use_regex
    )


def _splits_at_words(pre: dict | None) -> bool:
    """Whether the pre-tokenizer is one the module's proof covers."""
    if pre is None:
        return False
    if _byte_level(pre, use_regex=True):  # GPT-2's pattern, inside ByteLevel
        return True
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if len(steps) != 2 or not _byte_level(steps[1], use_regex=False):
        return False
    split = steps[0]
    return (
        split.get("type") == "Split"
        and split.get("behavior") == "Isolated"
        and not split.get("invert", False)
        and split.get("pattern", {}).get("Regex") in PATTERNS
    )


def cuts_at_words(tok) -> bool:
    """Whether the loaded `tokenizers.Tokenizer` may be cut at a space between two letters
    (the module's proof holds for it)."""
    if type(tok.model).__name__ != "BPE" or tok.model.dropout not in (None, 0.0):
        return False
    if tok.normalizer is not None and type(tok.normalizer).__name__ != "NFC":
        return False
    pre = tok.pre_tokenizer
    if not _splits_at_words(None if pre is None else json.loads(pre.__getstate__())):
        return False
    return not any(
        t.lstrip or t.rstrip or t.single_word or any(c.isspace() for c in t.content)
        for t in tok.get_added_tokens_decoder().values()
    )
