"""What the tokenizer tests share: a document's ids in an encoded group, and the text pieces
their property tests build documents from."""

from __future__ import annotations

from hypothesis import strategies as st


def doc_tokens(group, i):
    """Document `i`'s ids in `group` (a `TokenGroup`), as an array."""
    start = int(group.starts[i])
    return group.tokens[start : start + int(group.lengths[i])]


# Words and the whitespace and characters a normalizer treats specially: runs of spaces,
# newlines and tabs, combining marks, compatibility characters NFKC rewrites (ligature,
# full-width, diaeresis that decomposes to a space and a mark), non-Latin scripts.
PIECES = st.sampled_from(
    [
        "the",
        "data",
        "token",
        "x" * 30,
        " ",
        "  ",
        "\n",
        "\t",
        " \n ",
        "*" * 7,
        "e\u0301",
        "\u00a8",
        "\ufb01le",
        "\uff21\uff22",
        "\u4e2d\u6587",
        "\u00e9t\u00e9",
        "(",
        ").",
        "42",
        "\u00a0",
        "--",
    ]
)
