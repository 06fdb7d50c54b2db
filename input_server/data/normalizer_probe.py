"""Measuring a Hugging Face normalizer's expansion when its static bound is too loose.

The static bound (model_checks.hf_normalizer_expansion) multiplies each member's worst case,
which no real chain reaches: ALBERT's NFKD (18) then nmt_nfkc (18) then Lowercase (3) scores
1,944, though no character becomes more than a handful. When that product passes
MAX_NORMALIZER_EXPANSION, the server runs the loaded normalizer on probes instead and
refuses only what a probe shows growing past the limit.
"""

from __future__ import annotations

import functools
import math

from input_server.data.model_checks import MAX_NORMALIZER_EXPANSION

# Past this product even a measurement is not worth its memory (the largest intermediate
# string of a one-character probe could be this long); real chains are far below it
# (ALBERT's 1,944), a chain of 17 doubling Replaces is past it.
MAX_MEASURED_PRODUCT = MAX_NORMALIZER_EXPANSION**2

# Characters one probe may hold times the static product: the most a probe may grow to (about
# 1 M characters, ~20 MB in tokenizers' aligned strings) while it is measured.
_PROBE_BUDGET = 1 << 20
_CHUNK = 64  # code points per probe, "\n"-separated (see measured_expansion)
_RUN = 32  # repeats of a Replace pattern per probe


def _chunk_len(static: int) -> int:
    return max(1, min(_CHUNK, _PROBE_BUDGET // max(1, static)))


@functools.lru_cache(maxsize=4)
def _code_point_probes(step: int) -> tuple[str, ...]:
    """Every code point a Python str can hand to Rust (no lone surrogates), `step` to a
    probe, "\n" between them (a probe's characters are its even places); built once per
    process (~0.5 s, ~7 MB), then reused by every model's check."""
    points = [*range(0xD800), *range(0xE000, 0x110000)]
    return tuple("\n".join(map(chr, points[i : i + step])) for i in range(0, len(points), step))


def _run_probes(node) -> list[str]:
    """Probes for the members whose output depends on more than one character: each Replace
    pattern repeated (a String pattern as is; a Regex's text and each of its characters, so
    " {2,}" is probed with runs of spaces)."""
    probes = []
    for member in _members(node):
        if member.get("type") != "Replace":
            continue
        pattern = member.get("pattern") or {}
        text = str(pattern.get("String", pattern.get("Regex", "")))
        probes += [text, *dict.fromkeys(text)] if "Regex" in pattern else [text]
    return [p for p in probes if p]


def _members(node):
    if isinstance(node, dict) and node.get("type") == "Sequence":
        for member in node.get("normalizers") or []:
            yield from _members(member)
    elif isinstance(node, dict):
        yield node


def measured_expansion(normalize, node, static: int) -> int:
    """The most characters `normalize` was seen to make of one character, stopping at the
    first probe past MAX_NORMALIZER_EXPANSION (returned as measured, to be refused).

    Every code point, 64 to a probe separated by "\\n": for members that act per character
    (Unicode forms, case, accents, Strip, Bert, ByteLevel, Prepend) a probe's output is the
    sum of its characters' outputs, since "\\n" is a starter no Unicode composition joins to
    its neighbours, so a probe whose whole output is within the limit proves each of its
    characters is; a probe past it is measured character by character, which is exact. The
    members that look at more than one character (Replace; its static bound is already no
    more than the limit for each member) are probed with runs of what their patterns name.
    What no probe covers: a Regex matching only text its pattern does not spell out, and a
    charsmap key of several characters: each of those members alone is still bounded by its
    static figure (model_checks), only their products are measured.
    """
    worst = 1
    for probe in _code_point_probes(_chunk_len(static)):
        if len(normalize(probe)) <= MAX_NORMALIZER_EXPANSION:
            continue
        for ch in probe[::2]:
            worst = max(worst, len(normalize(ch)))
            if worst > MAX_NORMALIZER_EXPANSION:
                return worst
    for text in _run_probes(node):
        probe = text * max(1, min(_RUN, _PROBE_BUDGET // max(1, static * len(text))))
        worst = max(worst, math.ceil(len(normalize(probe)) / len(probe)))
        if worst > MAX_NORMALIZER_EXPANSION:
            return worst
    return worst
