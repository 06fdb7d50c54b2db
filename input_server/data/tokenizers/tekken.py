"""Mistral's tekken tokenizers (`tekken.json`: Mistral NeMo's, Pixtral's, Ministral's, Small 3's
and later), tokenized as mistral-common's `Tekkenizer` tokenizes text.

`Tekkenizer.from_file` reads the JSON: `config.pattern` (the split regex), the `vocab` list of
`{rank, token_bytes (base64), token_str}` in rank order, and `config.default_num_special_tokens`
special tokens numbered first: the file's `special_tokens` list (a file of version v7 or before
without one gets mistral-common's twenty, `OLD_SPECIALS`), then `<SPECIAL_i>` fillers up to
that number. There are `config.default_vocab_size` ids in all: the ranks past
`default_vocab_size - default_num_special_tokens` are dropped. `Tekkenizer.encode(text, bos,
eos)` is one tiktoken encode of the whole text with no special tokens (special-token text in a
document stays text), each id offset by the number of special tokens, then `<s>` before and
`</s>` after (their ranks) as asked. All of that is done here with tiktoken, as mistral-common
itself does, so the ids are mistral-common's (`tests/unit/test_tekken.py` compares them on real
text, with the tekken files mistral-common ships).

Not served, because the server serves text: chat and instruct formatting, and the image and
audio tokens of a file's `image` / `audio` sections (Pixtral's, Voxtral's), which those
sections are not read for. `SpecialTokenPolicy` decides only how ids decode, and the server
never decodes.

A long document is cut before tokenizing where the ids stay the same (`groups.Cutter`), at a
space between two letters, for Mistral's own pattern (`PATTERN`): `word_cuts`' proof holds for
it. Its two letter alternatives take letters and marks (`\\p{M}`) after at most one leading
non-letter, and no alternative takes a space after a letter; so the match that holds the letter
before the space ends there, the next one starts at the space whatever follows, and nothing
looks behind. tiktoken splits with that regex and encodes each piece alone.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from collections.abc import Callable

import numpy as np

from input_server.data.tokenizers.base import IdsInfo, LimitCall, ModelTokenizer, over_slices
from input_server.data.tokenizers.checks import (
    check_readable,
    kind_hint,
    looks_like,
)
from input_server.data.tokenizers.groups import Cutter, framed
from input_server.data.tokenizers.loaded import LoadedModels
from input_server.data.tokenizers.tiktoken import MAX_RANKS, encode_buffer, rust_core
from input_server.data.tokenizers.word_cuts import LETTER_SPACES, between_letters
from input_server.errors import InvalidSpecError, shorten

# The split pattern of Mistral's tekken files, verbatim: the one the cut above is proved for.
PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# mistral-common's `Tekkenizer.DEPRECATED_SPECIAL_TOKENS`, in order: the special tokens of a
# file of version v7 or before that lists none.
OLD_SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
# The last version whose files may leave `special_tokens` out (mistral-common refuses it after).
OLD_SPECIALS_UNTIL = 7
# The names mistral-common gives the special tokens a file does not list (its
# SPECIAL_TOKEN_TEMPLATE): a listed one may not take a filler's name.
_FILLER = re.compile(r"<SPECIAL_(0|[1-9][0-9]*)>")
_VERSION = re.compile(r"v([1-9][0-9]*)")
VOCAB_KEYS = frozenset({"rank", "token_bytes", "token_str"})
# The most special tokens a file may number: far above Mistral's own files, and ids stay small.
MAX_SPECIALS = 1 << 20
# A document with a run of this much whitespace is left to the reference by the fast backend:
# tiktoken's regex gives up on runs a few times longer (and mistral-common with it) where
# fastokens' does not, and a backend serves only what the reference gives. Python's `\s` holds
# every character Rust's does, so the check errs towards the reference. The lookbehind starts
# a match only where a run starts: one pass over the text.
HANDED_RUN = 1 << 18
_LONG_WHITESPACE = re.compile(rf"(?<!\s)\s{{{HANDED_RUN}}}")
# Loaded Encodings, each with what its file says beside the ranks (`Tekken`).
_LOADED: LoadedModels[tuple] = LoadedModels()


@dataclasses.dataclass(frozen=True)
class Tekken:
    """What a tekken file says beside its ranks.

    Attributes:
      pattern: the split regex (tiktoken's `pat_str`).
      num_special: the special tokens numbered first: every rank's id is its rank plus this.
      vocab_size: ids run from 0 to `vocab_size - 1` (`config.default_vocab_size`).
      specials: the file's own special tokens (fillers left out), text to id.
      version: `config.version`, as written ("v3").
    """

    pattern: str
    num_special: int
    vocab_size: int
    specials: dict[str, int]
    version: str

    def id_of(self, token: str) -> int:
        """The id of special token `token`, -1 where the file has none."""
        return self.specials.get(token, -1)


def _refusal(shown: str, why: str) -> InvalidSpecError:
    return InvalidSpecError(
        f"`tokenizer.model` {shown!r} is not a tekken file the server can read: {why}."
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json(path: str, shown: str) -> dict:
    """The file's JSON object, its vocabulary's size bounded before it is parsed (a parsed
    entry takes several times its bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.count(b'"token_bytes"') > MAX_RANKS:
        raise _refusal(shown, f"it holds more than {MAX_RANKS} vocabulary entries (MAX_RANKS)")
    try:
        data = json.loads(raw.decode("utf-8"))  # as mistral-common opens it: UTF-8 text
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidSpecError(
            f"`tokenizer.model` {shown!r} is not a JSON file ({shorten(str(e), 200)})"
            f"{_hint(path, None)}."
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        hint = _hint(path, data) or "; a tekken file is a JSON object with a `config`"
        raise InvalidSpecError(f"`tokenizer.model` {shown!r} is not a tekken file{hint}.")
    return data


def _hint(path: str, data) -> str:
    """`kind_hint` for a file the tekken kind cannot read; JSON that is broken, or holds no
    `model`, is not taken for a Hugging Face tokenizer.json (whose pipeline is its `model`)."""
    if looks_like(path) == "huggingface" and not (isinstance(data, dict) and "model" in data):
        return ""
    return kind_hint(path, "tekken")


def _config(config: dict, shown: str) -> tuple[str, int, int, int]:
    """(pattern, special tokens, ids in all, version number) from the file's `config`."""
    version = config.get("version")
    found = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if found is None:
        raise _refusal(shown, f"`config.version` is {version!r}, not a version such as 'v3'")
    pattern = config.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise _refusal(shown, f"`config.pattern` is {shorten(repr(pattern), 60)}, not a regex")
    sizes = []
    for key in ("default_num_special_tokens", "default_vocab_size"):
        value = config.get(key)
        if not _is_int(value) or value < 0:
            raise _refusal(shown, f"`config.{key}` is {value!r}, not a count")
        sizes.append(value)
    if sizes[0] > MAX_SPECIALS:
        raise _refusal(shown, f"it numbers {sizes[0]} special tokens, past {MAX_SPECIALS}")
    return pattern, sizes[0], sizes[1], int(found.group(1))


def _specials(data: dict, num_special: int, vocab_size: int, version: int, shown: str):
    """The file's special tokens, text to id, as mistral-common numbers them: its
    `special_tokens` list (ids are their `rank`s), or OLD_SPECIALS for a file of version v7 or
    before without one; with `<SPECIAL_i>` fillers after them, all names distinct."""
    listed = data.get("special_tokens")
    if listed is None:
        if version > OLD_SPECIALS_UNTIL:
            raise _refusal(shown, f"version v{version} needs a `special_tokens` list")
        listed = [{"rank": i, "token_str": t} for i, t in enumerate(OLD_SPECIALS)]
    if not isinstance(listed, list) or len(listed) > num_special:
        n = len(listed) if isinstance(listed, list) else type(listed).__name__
        raise _refusal(shown, f"`special_tokens` holds {n}, past {num_special} special tokens")
    specials: dict[str, int] = {}
    for i, token in enumerate(listed):
        text = token.get("token_str") if isinstance(token, dict) else None
        rank = token.get("rank") if isinstance(token, dict) else None
        if not isinstance(text, str) or not _is_int(rank):
            raise _refusal(shown, f"`special_tokens[{i}]` has no string `token_str` and `rank`")
        if not 0 <= rank < vocab_size:
            raise _refusal(
                shown, f"special token {text!r} has id {rank}, outside 0 to {vocab_size - 1}"
            )
        filler = _FILLER.fullmatch(text)
        if text in specials or (filler and len(listed) <= int(filler.group(1)) < num_special):
            raise _refusal(shown, f"special token {text!r} is named twice")
        specials[text] = rank
    return specials


def _ranks(vocab, inner: int, shown: str) -> dict[bytes, int]:
    """tiktoken's ranks from the first `inner` vocabulary entries, checked as mistral-common
    checks them: exactly its three keys, the rank its place, the first 256 the single bytes,
    no token twice."""
    if not isinstance(vocab, list):
        raise _refusal(shown, "its `vocab` is not a list")
    if inner < 256:
        raise _refusal(shown, f"it keeps {inner} ranks, fewer than the 256 single bytes")
    if len(vocab) < inner:
        raise _refusal(
            shown,
            f"`config.default_vocab_size` asks for {inner} ranks after the special tokens, and "
            f"`vocab` holds {len(vocab)}",
        )
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(vocab[:inner]):
        if not isinstance(entry, dict) or entry.keys() != VOCAB_KEYS:
            raise _refusal(shown, f"`vocab[{i}]` is {_short(entry)}, not {sorted(VOCAB_KEYS)}")
        if entry["rank"] != i:
            raise _refusal(shown, f"`vocab[{i}]` has rank {_short(entry['rank'])}, not {i}")
        try:
            token = base64.b64decode(entry["token_bytes"])  # not validated: as mistral-common
        except (binascii.Error, ValueError, TypeError):
            raise _refusal(shown, f"`vocab[{i}].token_bytes` is not base64") from None
        if i < 256 and token != bytes([i]):
            raise _refusal(shown, f"`vocab[{i}]` is not the byte {i} (ranks 0-255 are bytes)")
        if token in ranks:
            raise _refusal(shown, f"`vocab[{i}]` repeats the token of rank {ranks[token]}")
        ranks[token] = i
    return ranks


def _short(value) -> str:
    return shorten(json.dumps(value, ensure_ascii=False), 80)


def read_tekken(path: str, written: str) -> tuple[Tekken, dict[bytes, int]]:
    """The tekken file at `path` (`written`: as the client wrote it) and its ranks, as
    `Tekkenizer.from_file` reads them; what it would refuse, or what the server cannot serve
    as it does, is refused naming the file."""
    shown = shorten(written)
    data = _json(path, shown)
    pattern, num_special, vocab_size, version = _config(data["config"], shown)
    specials = _specials(data, num_special, vocab_size, version, shown)
    ranks = _ranks(data.get("vocab"), vocab_size - num_special, shown)
    version_text = data["config"]["version"]
    return Tekken(pattern, num_special, vocab_size, specials, version_text), ranks


class ShiftedBackend:
    """A fast backend (fastokens, over a tokenizer.json derived from the ranks) whose ids move
    past the special tokens, as the reference's do (`backends.Backend`)."""

    def __init__(self, inner, offset: int, derived: str):
        self.inner = inner  # a `fast.Fastokens`
        self.name, self.version = inner.name, inner.version
        self.derived = derived  # the tokenizer.json it was loaded from
        self.offset = np.int32(offset)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' bare ids in one int32 array, and where each text starts (n + 1 offsets);
        a group holding a run of HANDED_RUN whitespace characters raises (the reference's)."""
        if any(len(t) >= HANDED_RUN and _LONG_WHITESPACE.search(t) for t in texts):
            raise ValueError(f"a run of {HANDED_RUN}+ whitespace characters: the reference's")
        flat, offsets = self.inner.encode_flat(texts)
        return flat.view(np.int32) + self.offset, offsets

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        return framed(*self.encode_flat(texts), head, tail)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        flat, offsets = self.encode_flat(texts)
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(texts))]


class TekkenTokenizer(ModelTokenizer):
    """A tekken file, as mistral-common's `Tekkenizer.encode(text, bos, eos)` tokenizes with it.

    tiktoken runs it, one Rust call per document (each releasing the GIL), the whole document
    at once as mistral-common feeds it; under `trim`, long documents are cut first (see the
    module's docstring)."""

    KIND = "tekken"
    LIBRARY = "tiktoken"
    REFERENCE = (
        "mistral-common's Tekkenizer.encode(text, bos, eos) as written: "
        "tiktoken.Encoding.encode of the whole document, ids offset by the special tokens"
    )
    # The file is parsed whole into Python objects, a few times its bytes.
    MAX_FILE_BYTES = 64 << 20
    BACKENDS = ("fastokens",)

    def __init__(self, spec, **kw):
        # The tokenizer.json derived from the ranks, handed over by the process that chose
        # fastokens (deriving it is seconds of a worker's start); None: not handed.
        self._derived: str | None = None
        super().__init__(spec, **kw)
        tekken, info = self._tekken, self.info()
        if tekken.pattern == PATTERN:
            self.cutter = Cutter(
                extendable=True,
                bos=spec.add_bos and info.bos_id >= 0,
                eos=spec.add_eos and info.eos_id >= 0,
                eos_id=info.eos_id,
                at=between_letters,
                places=LETTER_SPACES,
            )

    def load_backend(self, name: str) -> ShiftedBackend:
        """fastokens over a tokenizer.json derived from the ranks (as for a tiktoken file
        fastokens' own loader refuses), read from the tokenizer cache where it is kept."""
        from input_server.data.tokenizers.fast import (
            DERIVED,
            Fastokens,
            derived_fields,
            derived_json,
        )

        self.model()  # its checks first
        keep, derived, pattern = self.router.keep, self._derived, self._tekken.pattern
        fields = derived_fields(self.digest(), pattern)
        kept = None if derived is not None or keep is None else keep.get(DERIVED, fields)
        if kept is not None:
            derived = kept.decode()
            self.router.note_cache_read("its tokenizer.json derived from the ranks")
        if derived is None:
            derived = derived_json(self.spec.model, self._ranks, pattern, shorten(self.written))
            if keep is not None:
                keep.put(DERIVED, fields, derived.encode())
        return ShiftedBackend(Fastokens.from_json(derived), self._tekken.num_special, derived)

    def _ranks(self) -> dict[bytes, int]:
        return read_tekken(self.spec.model, self.written)[1]

    def __getstate__(self):
        state = super().__getstate__()
        fast = self.router.backend
        if fast is not None and fast.derived is not None:
            state["_derived"] = fast.derived
        return state

    def _load(self):
        """The Encoding, shared by this process's tokenizers of the file as it stands."""
        enc, self._tekken = _LOADED.get(self.spec.model, self._read)
        return enc

    def _read(self):
        import tiktoken

        check_readable(self.spec.model, self.written)
        tekken, ranks = read_tekken(self.spec.model, self.written)
        try:
            enc = tiktoken.Encoding(
                name="tekken",
                pat_str=tekken.pattern,
                mergeable_ranks=ranks,
                special_tokens={},  # mistral-common numbers them itself, before the ranks
            )
        except (ValueError, OverflowError) as e:
            raise _refusal(shorten(self.written), f"tiktoken refuses it ({e})") from None
        return enc, tekken

    def info(self) -> IdsInfo:
        self.model()
        t = self._tekken
        return IdsInfo(
            t.vocab_size, t.id_of("<s>"), t.id_of("</s>"), t.id_of("<pad>"), t.id_of("<unk>")
        )

    def _bare(self, core, text: str) -> np.ndarray:
        """One document's ids without BOS/EOS: tiktoken's ranks, offset past the specials."""
        try:
            buf = encode_buffer(core, text)
        except ValueError as e:  # tiktoken's regex gives up on a very long run of spaces
            raise InvalidSpecError(
                f"`tokenizer.model` {shorten(self.written)!r}: its split pattern cannot split "
                f"a document of {len(text):,} characters (tiktoken: {shorten(str(e), 120)}), "
                f"nor can mistral-common, which runs the same tiktoken call; remove the long "
                f"runs of whitespace from the data."
            ) from None
        return np.frombuffer(buf, np.uint32).astype(np.int32) + np.int32(self._tekken.num_special)

    def _encode(self, texts: list[str], *, add_bos: bool, add_eos: bool) -> list[np.ndarray]:
        core = rust_core(self.model())
        head, tail = (np.asarray(x, np.int32) for x in self.ends(add_bos, add_eos))
        return [np.concatenate([head, self._bare(core, t), tail]) for t in texts]

    def limit_calls(self, threads: int) -> dict[str, LimitCall]:
        enc = self.model()
        core = rust_core(enc)
        extra = sum(map(len, self.ends()))

        def batch(texts):
            return [len(x) + extra for x in enc.encode_ordinary_batch(texts, num_threads=threads)]

        def part(texts):
            return [memoryview(encode_buffer(core, t)).nbytes // 4 + extra for t in texts]

        return {
            f"Encoding.encode_ordinary_batch(num_threads={threads})": batch,
            f"{threads} threads x Encoding._core_bpe.encode_to_tiktoken_buffer": over_slices(
                part, threads
            ),
        }

    def maxtext_encoder(self) -> Callable[[str], list[int]]:
        """mistral-common's `Tekkenizer.encode` as written (there is no MaxText class for
        tekken; `bench` compares with this)."""
        enc, offset = self.model(), self._tekken.num_special
        head, tail = self.ends()

        def encode(s: str) -> list[int]:
            tokens = [t + offset for t in enc.encode(s)]
            return [*head, *tokens, *tail]

        return encode
