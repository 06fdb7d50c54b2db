"""Measuring a Hugging Face normalizer's expansion when its static bound is too loose.

The static bound (checks.hf_normalizer_expansion) multiplies each member's worst case,
which no real chain reaches: ALBERT's NFKD (18) then nmt_nfkc (18) then Lowercase (3) scores
1,944, though no character becomes more than a handful. When that product passes
MAX_NORMALIZER_EXPANSION, the server runs the loaded normalizer on probes instead and
refuses only what a probe shows growing past the limit.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import math
import struct

from input_server.data.tokenizers.checks import MAX_NORMALIZER_EXPANSION

# Past this product even a measurement is not worth its memory (the largest intermediate
# string of a one-character probe could be this long); real chains are far below it
# (ALBERT's 1,944), a chain of 17 doubling Replaces is past it.
MAX_MEASURED_PRODUCT = MAX_NORMALIZER_EXPANSION**2

# Characters one probe may hold times the static product: the most a probe may grow to (about
# 1 M characters, ~20 MB in tokenizers' aligned strings) while it is measured.
_PROBE_BUDGET = 1 << 20
_CHUNK = 64  # code points per probe, "\n"-separated (see _measure)
_RUN = 32  # repeats of a Replace pattern per probe


def _chunk_len(static: int) -> int:
    return max(1, min(_CHUNK, _PROBE_BUDGET // max(1, static)))


# Planes 4-13 (never assigned in any Unicode version) and 15-16 (private use): no Unicode
# form, case mapping, accent or Bert rule touches their characters (Unicode's stability
# policy keeps private use so), so they are probed only when a member could: a charsmap with
# keys there, a Replace that matches there, or ByteLevel (whose output bytes differ).
# Ranges, joined where a probe is built: a tuple of their million code points cost every
# process that imports this module (a `serve` process before it listens) tens of ms and MBs.
_NEAR = (range(0xD800), range(0xE000, 0x40000), range(0xE0000, 0xF0000))
_FAR = (range(0x40000, 0xE0000), range(0xF0000, 0x110000))


@functools.lru_cache(maxsize=8)
def _code_point_probes(step: int, far: bool) -> tuple[str, ...]:
    """The code points a Python str can hand to Rust (no lone surrogates) of the near planes
    (or, `far`, of the others), `step` to a probe, "\n" between them (a probe's characters
    are its even places); built once per process, then reused by every model's check."""
    points = tuple(itertools.chain.from_iterable(_FAR if far else _NEAR))
    return tuple("\n".join(map(chr, points[i : i + step])) for i in range(0, len(points), step))


def _charsmap_reaches_far(blob: bytes) -> bool:
    """Whether a precompiled charsmap's double-array trie (darts-clone units: label in the
    low byte, offset above bit 10) has a key opening with UTF-8 byte F1-F4, i.e. a
    character of plane 4 or above."""
    if len(blob) < 8:
        return False
    (size,) = struct.unpack("<I", blob[:4])
    units = struct.unpack(f"<{min(size, len(blob) - 4) // 4}I", blob[4 : 4 + size])
    if not units:
        return True  # a trie we cannot read: probe everything

    def offset(unit: int) -> int:
        return (unit >> 10) << ((unit & (1 << 9)) >> 6)

    base = offset(units[0])
    if any(0xF1 <= b <= 0xF4 for b in blob[4 + size :]):
        return True  # a normalized string holding a far character
    return any(
        (base ^ b) < len(units) and units[base ^ b] & ((1 << 31) | 0xFF) == b
        for b in range(0xF1, 0xF5)
    )


def _alone(member: dict):
    """One member as a normalizer of its own (a tiny tokenizer around it)."""
    from tokenizers import Tokenizer

    model = {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}
    tok = Tokenizer.from_str(json.dumps({"version": "1.0", "normalizer": member, "model": model}))
    return tok.normalizer.normalize_str


def _far_planes_touched(node) -> bool:
    """Whether a member could treat a far-plane character otherwise than as itself, or make
    one: a ByteLevel, a charsmap with far keys or far strings, a Replace or Prepend writing
    one, a String pattern naming one, or a Regex Replace that changes a probe of them when
    applied alone (its input there is the character itself, since no member before it makes
    or changes one)."""
    for member in _members(node):
        kind = member.get("type")
        if kind == "ByteLevel":
            return True
        if kind == "Precompiled":
            raw = member.get("precompiled_charsmap") or ""
            if _charsmap_reaches_far(base64.b64decode(raw)):
                return True
        written = str(member.get("content", member.get("prepend", "")))
        pattern = member.get("pattern") or {}
        if any(ord(c) >= 0x40000 and not 0xE0000 <= ord(c) < 0xF0000 for c in written):
            return True  # a far character made by this member, met by the members after it
        if kind == "Replace" and any(ord(c) >= 0x40000 for c in str(pattern.get("String", ""))):
            return True
        if kind == "Replace" and "Regex" in pattern:
            normalize = _alone(member)
            if any(normalize(p) != p for p in _code_point_probes(_CHUNK, True)):
                return True
    return False


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


_MEASURED: dict[str, int] = {}  # a normalizer's description's digest -> what it measured


def measured_expansion(normalize, node, static: int) -> int:
    """_measure, once per normalizer description per process (a model reloaded after the
    model cache let it go is not measured again)."""
    key = hashlib.sha256(json.dumps(node, sort_keys=True).encode()).hexdigest()
    if key not in _MEASURED:
        if len(_MEASURED) >= 256:
            _MEASURED.clear()
        _MEASURED[key] = _measure(normalize, node, static)
    return _MEASURED[key]


def _measure(normalize, node, static: int) -> int:
    """The most characters `normalize` was seen to make of one character, stopping at the
    first probe past MAX_NORMALIZER_EXPANSION (returned as measured, to be refused).

    Every code point (those of the far planes only when a member could touch them, see
    _far_planes_touched), 64 to a probe separated by "\\n": for members that act per
    character (Unicode forms, case, accents, Strip, Bert, ByteLevel, Prepend, a charsmap's
    one-character keys) a probe's output is the sum of its characters' outputs, since "\\n"
    is a starter no Unicode composition joins to its neighbours and a grapheme boundary on
    both sides, so a probe whose whole output is within the limit proves each of its
    characters is; a probe past it is measured character by character, which is exact. The
    members that look at more than one character (Replace; its static bound is already no
    more than the limit for each member) are probed with runs of what their patterns name.
    What no probe covers: a Regex matching only text its pattern does not spell out, and a
    charsmap key of several characters: each of those members alone is still bounded by its
    static figure (checks.py), only their products are measured.
    """
    worst = 1
    probes = _code_point_probes(_chunk_len(static), False)
    if _far_planes_touched(node):
        probes += _code_point_probes(_chunk_len(static), True)
    for probe in probes:
        if len(normalize(probe)) <= MAX_NORMALIZER_EXPANSION:
            continue
        for ch in probe[::2]:
            worst = max(worst, len(normalize(ch)))
            if worst > MAX_NORMALIZER_EXPANSION:
                return worst
    for text in _run_probes(node):
        if len(text) * static > _PROBE_BUDGET:
            # Probing it could hold more than the budget (real patterns are a few characters).
            raise ValueError(f"a Replace pattern of {len(text)} characters, too long to probe")
        probe = text * max(1, min(_RUN, _PROBE_BUDGET // max(1, static * len(text))))
        worst = max(worst, math.ceil(len(normalize(probe)) / len(probe)))
        if worst > MAX_NORMALIZER_EXPANSION:
            return worst
    return worst
