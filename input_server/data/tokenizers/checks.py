"""What a model file may cost and what its faults become, for every kind: a missing,
unreadable or oversized file is refused by name before it is read, any failure while loading
or using a model is INVALID_ARGUMENT naming the model file, a normalizer that could multiply a
document's length is refused at load, and a file given under the wrong kind is named by the
kind it looks like.

A model inside a data root may come from anywhere (a downloaded tokenizer), and one request
loads it: its cost must be known before the work, not found out by the server's memory.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
import os
import re
import struct

from input_server.errors import (
    DataNotFoundError,
    InputServerError,
    InvalidSpecError,
    UnreadableError,
    shorten,
)

# The most characters a model's normalizer may make of one character of a document. Real ones
# stay far below: NFKC's longest is 18 (U+FDFA), sentencepiece's nmt_nfkc charsmap 18, a Bert
# normalizer 9, Llama's Prepend + Replace 4. A hostile one mapping "e" to 20,000 characters
# (measured: a 36 KB sentencepiece model, a server OOM-killed in 20 s) is refused by it.
MAX_NORMALIZER_EXPANSION = 256

# Worst characters out per character in, by Hugging Face normalizer type (Unicode's stated
# bounds: NFKD/NFKC 18, NFD/NFC 4 with composition; full lowercasing 3; Bert's CJK spacing 3
# times lowercasing 3; ByteLevel one character per UTF-8 byte, at most 4).
_HF_FACTORS = {
    "NFKC": 18,
    "NFKD": 18,
    "NFC": 4,
    "NFD": 4,
    "Lowercase": 3,
    "BertNormalizer": 9,
    "ByteLevel": 4,
    "Strip": 1,
    "StripAccents": 1,
    "Nmt": 1,
}


def file_identity(path: str | None) -> tuple | None:
    """What a loaded model is kept by: the file as it stands (a changed file loads anew)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:  # gone since it was resolved: loading it names the file
        return (path,)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def check_readable(path: str, written: str, key: str = "tokenizer.model") -> None:
    """Refuses a missing or unreadable model file by the name the client wrote (`written`):
    the libraries would say only "not found", or name the resolved path."""
    shown = shorten(written)
    if not os.path.isfile(path):
        raise DataNotFoundError(f"`{key}`: no such file {shown!r}.")
    try:
        open(path, "rb").close()
    except PermissionError as e:
        raise UnreadableError(
            f"`{key}`: the server may not read {shown!r} (permission denied)."
        ) from e


def bounded(path: str | None, limit: int, written: str, why: str = "") -> str | None:
    """`path`, refused if it holds more than `limit` bytes (each kind reads its model file
    whole); a missing one is named when it is opened."""
    try:
        size = os.stat(path).st_size if path is not None else 0
    except OSError:
        return path
    if size > limit:
        raise InvalidSpecError(
            f"`tokenizer.model` {shorten(written)!r} holds {size} bytes, more than the "
            f"{limit >> 20} MB a model file may{why}."
        )
    return path


# Errors an interpreter must keep: a stop asked for, not a model's fault.
NOT_THE_MODEL = (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)


def model_error(written: str, doing: str, e: BaseException) -> InvalidSpecError:
    """A model's fault in words naming its file (`written`: as the client wrote it)."""
    why = f"{type(e).__name__}: {e}".strip()
    return InvalidSpecError(
        f"`tokenizer.model` {shorten(written)!r} failed while {doing} ({shorten(why, 300)}); "
        f"the model file is damaged or hostile: replace it."
    )


@contextlib.contextmanager
def model_faults(written: str, doing: str):
    """Turns any failure of a model's own code into INVALID_ARGUMENT naming the model.

    Deliberately catches BaseException: the Rust libraries' panics (pyo3's PanicException,
    e.g. Oniguruma's "retry-limit-in-match over" on a catastrophic pre-tokenizer regex) derive
    from it, and would otherwise reach a client as INTERNAL. The project's own errors keep
    their status; a stop (KeyboardInterrupt, SystemExit) or MemoryError passes through.
    """
    try:
        yield
    except InputServerError:
        raise
    except NOT_THE_MODEL:
        raise
    except BaseException as e:  # noqa: BLE001 - see the docstring: panics are BaseException
        raise model_error(written, doing, e) from None


def charsmap_expansion(blob: bytes) -> int:
    """The most characters a precompiled charsmap (sentencepiece's, and Hugging Face's
    `Precompiled` normalizer) makes of one match: the longest of its normalized strings, which
    follow its double-array trie (`uint32 trie bytes, trie, NUL-separated strings`). A match
    consumes at least one character, so this bounds the normalized length per character."""
    if len(blob) < 4:
        return 1
    (trie_bytes,) = struct.unpack("<I", blob[:4])
    strings = blob[4 + trie_bytes :]
    return max([1, *(len(s.decode("utf-8", "replace")) for s in strings.split(b"\0"))])


def hf_normalizer_expansion(node) -> int:
    """An upper bound on the characters a Hugging Face normalizer (its `tokenizer.json` entry)
    makes of one character: a Sequence multiplies its members'. Raises ValueError naming a
    type it does not know (whose cost is unknown)."""
    if node is None:
        return 1
    if not isinstance(node, dict):
        raise ValueError(f"a normalizer that is not an object ({type(node).__name__})")
    kind = node.get("type")
    if kind == "Sequence":
        total = 1
        for member in node.get("normalizers") or []:
            # Every member is judged (an unknown type is refused wherever it stands); the
            # product is capped so that a long chain makes no huge integer.
            total = min(total * hf_normalizer_expansion(member), 10**18)
        return total
    if kind == "Replace":
        return _replace_expansion(node)
    if kind == "Prepend":
        return 1 + len(str(node.get("prepend", "")))
    if kind == "Precompiled":
        try:
            blob = base64.b64decode(node.get("precompiled_charsmap") or b"", validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise ValueError("a Precompiled normalizer whose charsmap is not base64") from None
        return charsmap_expansion(blob)
    if kind in _HF_FACTORS:
        return _HF_FACTORS[kind]
    raise ValueError(f"a normalizer of unknown type {kind!r}")


def _replace_expansion(node: dict) -> int:
    """A String pattern's match consumes its whole length and becomes `content`, so the text
    grows at most len(content)/len(pattern) per character (and a Replace that shrinks, like
    ALBERT's "``" -> '"', is 1). A Regex (or an empty String) may match the empty string,
    which inserts `content` before every character: 1 + len(content)."""
    content = len(str(node.get("content", "")))
    pattern = node.get("pattern") or {}
    literal = pattern.get("String") if isinstance(pattern, dict) else None
    if isinstance(literal, str) and literal:
        return max(1, math.ceil(content / len(literal)))
    return 1 + content


def hf_member_expansion(node) -> int:
    """The largest static bound of a single member of a normalizer (a Sequence's members,
    nested ones included): past MAX_NORMALIZER_EXPANSION, one member alone is refused; the
    product of several members within it is measured (normalizer_probe) instead."""
    if isinstance(node, dict) and node.get("type") == "Sequence":
        return max([1, *(hf_member_expansion(m) for m in node.get("normalizers") or [])])
    return hf_normalizer_expansion(node)


def expansion_refusal(written: str, factor: int, where: str) -> InvalidSpecError:
    return InvalidSpecError(
        f"`tokenizer.model` {shorten(written)!r}: its {where} can make up to {factor} "
        f"characters of one character of a document, more than the {MAX_NORMALIZER_EXPANSION} "
        f"the server allows (MAX_NORMALIZER_EXPANSION): a document would grow past any memory "
        f"budget; use a model with a usual normalizer."
    )


_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+={0,2} [0-9]+\r?$")


def looks_like(path: str) -> str | None:
    """The kind of model the file's first bytes look like, or None: a Mistral tekken file (a
    JSON object shaped as `_is_tekken` says), a Hugging Face `tokenizer.json` (any other JSON
    object), tiktoken ranks (`base64 rank` lines), or a sentencepiece model (a ModelProto
    opening with one of its length-delimited fields 1, 2 or 3)."""
    try:
        with open(path, "rb") as f:
            head = f.read(TEKKEN_HEAD_BYTES)
    except OSError:
        return None
    text = head.lstrip()
    if text.startswith(b"{"):
        return "tekken" if _is_tekken(text) else "huggingface"
    first = text.split(b"\n", 1)[0]
    if _TIKTOKEN_LINE.match(first):
        return "tiktoken"
    if _opens_a_model_proto(head):
        return "sentencepiece"
    return None


# What is read of a file to tell its kind: a tekken file's `config` (a pattern and a few
# numbers) and the start of its `vocab` fit well inside it, whichever comes first.
TEKKEN_HEAD_BYTES = 64 << 10
# The parts of JSON text that nesting is followed by: strings (escapes inside), brackets,
# colons. Numbers, literals, commas and spaces between them do not matter here.
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:]')


def _is_tekken(head: bytes) -> bool:
    """Whether the start of a JSON object (`head`) is a tekken file's: a top-level `config`
    object holding a `pattern`, or a top-level `vocab` list whose first entry holds
    `token_bytes`. A Hugging Face `tokenizer.json` has neither (its `vocab` is inside
    `model`, and a mapping); a file cut short inside `head` is judged on what it shows."""
    depth, key, owner, previous = 0, None, None, None
    for m in _JSON_TOKENS.finditer(head):
        token = m.group()
        if token in (b"{", b"["):
            depth += 1
            if depth == 2:  # the value of the top-level `key` opens
                owner = (key, token)
        elif token in (b"}", b"]"):
            depth -= 1
            if depth <= 1:
                owner = None
            if depth == 0:
                return False
        elif token == b":":
            key = previous if depth == 1 else key
            if owner == (b'"config"', b"{") and depth == 2 and previous == b'"pattern"':
                return True
            if owner == (b'"vocab"', b"[") and depth == 3 and previous == b'"token_bytes"':
                return True
        previous = token
    return False


# A ModelProto's length-delimited fields 1 (pieces), 2 (trainer spec) and 3 (normalizer spec):
# a serializer usually writes field 1 first, but Gemma 4's model opens with its normalizer.
_MODEL_PROTO_TAGS = (0x0A, 0x12, 0x1A)


def _opens_a_model_proto(head: bytes) -> bool:
    """The first field is one of _MODEL_PROTO_TAGS with a varint length (at most 5 bytes, not
    0), followed by a message that opens with a valid tag (field >= 1, a known wire type)."""
    if not head or head[0] not in _MODEL_PROTO_TAGS:
        return False
    i, length, shift = 1, 0, 0
    while i < min(len(head), 6):
        length |= (head[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not head[i - 1] & 0x80:
            break
    else:
        return False
    if length == 0 or i >= len(head):
        return False
    inner = head[i]
    return inner >> 3 >= 1 and inner & 7 in (0, 1, 2, 5)


def kind_hint(path: str, kind: str) -> str:
    """`; this looks like …: set kind = "…"` when the file looks like another kind's model."""
    found = looks_like(path)
    if found is None or found == kind:
        return ""
    what = {
        "tekken": 'a Mistral tekken file: set `kind = "tekken"`',
        "huggingface": 'a Hugging Face tokenizer.json: set `kind = "huggingface"`',
        "tiktoken": 'a tiktoken ranks file: set `kind = "tiktoken"`',
        "sentencepiece": 'a sentencepiece model: set `kind = "sentencepiece"` (the default)',
    }[found]
    return f"; this looks like {what}"


def refuse_tekken(path: str, written: str, kind: str) -> None:
    """Refuses a Mistral tekken file given as another kind, in one line saying what it is,
    before that kind's own parser fails on it with a message about its syntax."""
    if looks_like(path) == "tekken":
        raise InvalidSpecError(
            f"`tokenizer.model` {shorten(written)!r} is a Mistral tekken tokenizer (tekken.json: "
            f"a `config` with its split pattern and a `vocab` list), which the {kind} kind does "
            f'not read; set `kind = "tekken"`.'
        )
