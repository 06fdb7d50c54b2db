"""tiktoken BPE models (Llama 3's `tokenizer.model`), tokenized as MaxText 0.2.5's
`TikTokenTokenizer` (maxtext/input_pipeline/tokenizer.py) tokenizes them.

MaxText builds a `tiktoken.Encoding` from the ranks file with Llama 3's split pattern and 256
special tokens numbered after the ranks (BOS `<|begin_of_text|>` first, EOS
`<|end_of_text|>` second), pad id -1; it encodes special-token text in a document as plain
text, and feeds tiktoken at most 400,000 characters and runs of at most 25,000 spaces or
non-spaces at a time (tiktoken's Rust can overflow its stack beyond, openai/tiktoken#195). All of
that is reproduced here, so the ids are MaxText's.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable

import numpy as np

from input_server.data.tokenizers.base import IdsInfo, LimitCall, ModelTokenizer, over_slices
from input_server.data.tokenizers.checks import (
    check_readable,
    kind_hint,
    refuse_tekken,
)
from input_server.data.tokenizers.groups import CUT_CHARS_PER_TOKEN, framed
from input_server.data.tokenizers.loaded import LoadedModels
from input_server.errors import InvalidSpecError, shorten

# MaxText's TikTokenTokenizer.pat_str and special tokens, verbatim.
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
RESERVED = 256
SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    "<|reserved_special_token_3|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_4|>",
    "<|eot_id|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(5, RESERVED - 5)]
MAX_ENCODE_CHARS = 400_000
# Ids are int32 on their way to the batches, and the specials come after the ranks.
MAX_RANK = (1 << 31) - RESERVED
MAX_RUN = 25_000
# Python's `str.isspace()` and `re`'s `\s` agree on str patterns (both Py_UNICODE_ISSPACE).
_LONG_RUN = re.compile(rf"\s{{{MAX_RUN + 1}}}|\S{{{MAX_RUN + 1}}}")

# The most ranks a file may give, and the longest line: what one DescribeTokenizer may make
# the server hold is known before it reads (a 209 MB file of 10 M lines was read whole into a
# dict, then copied by tiktoken). Real files are far below: Llama 3's 128,000 ranks, o200k's
# 200,000; tokens of at most a few hundred bytes. A line may hold MAX_LINE_BYTES before its
# newline: base64 takes 4 characters per 3 bytes, so with the space and a rank of up to 7
# digits any token of up to 762 bytes fits (1,016 + 1 + 7 = 1,024); a 765-byte token (1,020
# characters) fits only beside a rank of at most 3 digits.
MAX_RANKS = 1 << 20
MAX_LINE_BYTES = 1024
# So no token holds more than this many bytes (765 beside a short rank; a character is at
# least one byte).
MAX_TOKEN_CHARS = 765
# Loaded Encodings, each with its (bos, eos) ids.
_LOADED: LoadedModels[tuple] = LoadedModels()


def split_runs(s: str, max_run: int = MAX_RUN):
    """MaxText's `_split_whitespaces_or_nonwhitespaces`: pieces of `s` with no run of more
    than `max_run` spaces or non-spaces."""
    run, is_space, start = 0, s[0].isspace() if s else False, 0
    for i, c in enumerate(s):
        now = c.isspace()
        if is_space ^ now:
            run, is_space = 1, now
        else:
            run += 1
            if run > max_run:
                yield s[start:i]
                start, run = i, 1
    yield s[start:]


def _may_run_long(s: str) -> bool:
    """False when `s` surely has no run of more than MAX_RUN spaces or non-spaces; True when it
    may (then `_LONG_RUN` decides). Cheaper than the regex, which steps through every
    character (17.7 ns a token on long documents, more than the fast backend's encode): a
    window of MAX_RUN + 1 characters holding a space or newline ends any non-space run
    (found by `rfind`, in C), and a whitespace run that long spans two consecutive characters
    at multiples of (MAX_RUN + 1) // 2 (a slice picks them)."""
    n = len(s)
    if n <= MAX_RUN:
        return False
    pos = 0
    while pos + MAX_RUN < n:
        end = pos + MAX_RUN + 1
        j = max(s.rfind(" ", pos, end), s.rfind("\n", pos, end))
        if j < pos:
            return True
        pos = j + 1
    marks = s[:: (MAX_RUN + 1) // 2]
    return any(a.isspace() and b.isspace() for a, b in zip(marks, marks[1:], strict=False))


def pieces(s: str) -> list[str]:
    """What MaxText hands tiktoken for `s`, in order: `s` itself unless it is long or has a
    long run (found in one regex pass, not MaxText's per-character loop)."""
    if len(s) <= MAX_ENCODE_CHARS and not (_may_run_long(s) and _LONG_RUN.search(s)):
        return [s]
    step = MAX_ENCODE_CHARS
    return [p for i in range(0, len(s), step) for p in split_runs(s[i : i + step], MAX_RUN)]


def read_ranks(path: str, written: str) -> dict[bytes, int]:
    """The ranks file: `base64(token) rank` lines (tiktoken's `load_tiktoken_bpe` format, read
    here without its cache, which keys local files by path and would serve a stale copy), a
    line at a time: a file that is not one stops at its first bad line."""
    ranks: dict[bytes, int] = {}
    shown = shorten(written)
    if _filled_lines(path) > MAX_RANKS:
        # Counted before parsing: a 13 MB file one rank past the cap took 3.5 s of parsing, in
        # stretches of up to 1.2 s with the GIL held, before its refusal (health probes waited).
        raise _too_many_ranks(shown)
    with open(path, "rb") as f:
        # A line at a time, each read at most MAX_LINE_BYTES + 1 long: a file with no newline
        # is never read whole.
        for n, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                raise InvalidSpecError(
                    f"`tokenizer.model` {shown!r}: line {n} is longer than {MAX_LINE_BYTES} "
                    f"bytes (MAX_LINE_BYTES), which no tiktoken rank line is"
                    f"{kind_hint(path, 'tiktoken')}."
                )
            line = line.strip()
            if not line:
                continue
            if len(ranks) >= MAX_RANKS:  # the file grew since it was counted
                raise _too_many_ranks(shown)
            try:
                token, rank = line.split()
                raw, rank = base64.b64decode(token, validate=True), int(rank)
            except (ValueError, binascii.Error):
                raise InvalidSpecError(
                    f"`tokenizer.model` {shown!r} is not a tiktoken BPE file: line {n} is "
                    f"{line[:60].decode('ascii', 'replace')!r}, not `base64-token rank`"
                    f"{kind_hint(path, 'tiktoken')}."
                ) from None
            if not 0 <= rank < MAX_RANK:
                raise InvalidSpecError(
                    f"`tokenizer.model` {shown!r}: line {n} gives rank {rank}, outside 0 to "
                    f"{MAX_RANK - 1}."
                )
            ranks[raw] = rank
    if not ranks:
        raise InvalidSpecError(f"`tokenizer.model` {shown!r} holds no tiktoken ranks.")
    return ranks


_BLANK_LINE = re.compile(rb"^[ \t\r\f\v]*\n", re.MULTILINE)


def _filled_lines(path: str, chunk_bytes: int = 1 << 20) -> int:
    """How many lines of the file hold anything but whitespace (the lines `read_ranks`
    parses), counted a chunk at a time in C, up to the first line longer than MAX_LINE_BYTES
    (which `read_ranks` refuses by its number)."""
    count, tail = 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            block = tail + chunk
            cut = block.rfind(b"\n") + 1  # whole lines only; the rest joins the next chunk
            # Lines less blank ones: one match object per blank line, none per rank line.
            count += block.count(b"\n", 0, cut) - len(_BLANK_LINE.findall(block, 0, cut))
            tail = block[cut:]
            if len(tail) > MAX_LINE_BYTES:
                return count + 1
    return count + bool(tail.strip())


def _too_many_ranks(shown: str) -> InvalidSpecError:
    return InvalidSpecError(
        f"`tokenizer.model` {shown!r} gives more than {MAX_RANKS} ranks "
        f"(MAX_RANKS, the most the server reads; Llama 3's file gives 128,000)."
    )


def rust_core(enc):
    """The Rust core of tiktoken Encoding `enc`, which `encode_buffer` calls (tiktoken offers
    no public call that returns ids without a Python list)."""
    return enc._core_bpe


def encode_buffer(core, text: str):
    """tiktoken's Rust encode of `text` (Encoding.encode_to_numpy's call, without its per-call
    special-token checks), which releases the GIL; lone surrogates repaired as tiktoken's own
    calls repair them."""
    try:
        return core.encode_to_tiktoken_buffer(text, set())
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return core.encode_to_tiktoken_buffer(text, set())


class PieceCutter:
    """Tokenizes a document that is trimmed to `trim_to` tokens only as far as it is kept: as
    MaxText encodes a document in MAX_ENCODE_CHARS pieces, each alone (`pieces`), the ids of
    its first k pieces are the first ids of the whole; the 19 MB documents of a real corpus
    were tokenized whole to keep 2,048 tokens (`groups.Cutter`'s interface)."""

    learns = False
    chars_per_token = CUT_CHARS_PER_TOKEN

    def __init__(self, *, bos: bool, eos: bool):
        self.bos, self.eos = bos, eos

    def cuts(self, texts: list[str], trim_to: int) -> bool:
        return max(map(len, texts), default=0) > MAX_ENCODE_CHARS

    def tokenized_chars(self, text_chars: int, trim_to: int | None) -> int:
        return text_chars if trim_to is None else min(text_chars, MAX_ENCODE_CHARS)

    def first_cut(self, text: str, trim_to: int) -> int:
        return min(len(text), MAX_ENCODE_CHARS)

    def longest_uncut(self, text: str, trim_to: int) -> int:
        """The most a short prefix's doubling may tokenize at once: every token covers at
        most MAX_TOKEN_CHARS characters, so that many a token needed hold enough tokens,
        and the doubling passes it by at most twice."""
        return min(len(text), 2 * max(MAX_ENCODE_CHARS, trim_to * MAX_TOKEN_CHARS))

    def learn(self, texts: list[str], ids: list[np.ndarray]) -> None:
        pass

    def encode(self, encode, texts: list[str], trim_to: int) -> list[np.ndarray]:
        """`encode(texts, add_bos=, add_eos=)` of each text's first pieces, as many as hold
        `trim_to` tokens (doubling); a text cut short loses the EOS it does not reach."""
        chunks = [1] * len(texts)
        work = [t[:MAX_ENCODE_CHARS] for t in texts]
        ids = encode(work, add_bos=self.bos, add_eos=self.eos)
        while True:
            short = [
                i
                for i, t in enumerate(texts)
                if len(ids[i]) - self.eos < trim_to and chunks[i] * MAX_ENCODE_CHARS < len(t)
            ]
            if not short:
                break
            for i in short:
                chunks[i] *= 2
            more = [texts[i][: chunks[i] * MAX_ENCODE_CHARS] for i in short]
            for i, x in zip(short, encode(more, add_bos=self.bos, add_eos=self.eos), strict=True):
                ids[i] = x
        for i, t in enumerate(texts):
            if self.eos and chunks[i] * MAX_ENCODE_CHARS < len(t):
                ids[i] = ids[i][:-1]  # not its end: the EOS comes after its last piece
        return ids


class PiecedBackend:
    """A fast backend (fastokens) fed as MaxText feeds tiktoken a document: in `pieces`, each
    encoded alone, their ids joined (`backends.Backend`)."""

    def __init__(self, inner):
        self.inner = inner  # a `fast.Fastokens`
        self.name, self.version = inner.name, inner.version
        self.derived = inner.derived  # the tokenizer.json derived from the ranks, if one was

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' bare ids in one array, and where each text starts (n + 1 offsets)."""
        lengths = np.fromiter(map(len, texts), np.int64, len(texts))
        parts, counts = list(texts), np.ones(len(texts), np.int64)
        # Only a text longer than MAX_RUN can be cut; from the last, so earlier slots hold.
        for i in np.flatnonzero(lengths > MAX_RUN)[::-1].tolist():
            split = pieces(texts[i])
            parts[i : i + 1], counts[i] = split, len(split)
        flat, offsets = self.inner.encode_flat(parts)
        if len(parts) == len(texts):
            return flat, offsets
        return flat, offsets[np.concatenate([[0], np.cumsum(counts)])]

    def encode_framed(
        self, texts: list[str], head: list[int], tail: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        return framed(*self.encode_flat(texts), head, tail)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        flat, offsets = framed(*self.encode_flat(texts), [], [])
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(texts))]


class TiktokenTokenizer(ModelTokenizer):
    """A tiktoken BPE model with MaxText's Llama 3 pattern and special tokens.

    tiktoken has no batch call of its own (`Encoding.encode_batch` is a Python thread pool), so
    a group is one Rust call per document (per piece, see `pieces`), each releasing the GIL."""

    KIND = "tiktoken"
    LIBRARY = "tiktoken"
    REFERENCE = (
        "MaxText's split_runs loop over each document's characters, then "
        "tiktoken.Encoding.encode per piece, as MaxText's TikTokenTokenizer"
    )
    # Its ranks are read into a dict and copied by tiktoken (Llama 3's file is 2.2 MB, o200k's
    # 3.6 MB).
    MAX_FILE_BYTES = 64 << 20
    ADDED_IDS = RESERVED  # the special tokens, numbered after the file's ranks
    BACKENDS = ("fastokens",)

    def __init__(self, spec, **kw):
        super().__init__(spec, **kw)
        self.cutter = PieceCutter(bos=spec.add_bos, eos=spec.add_eos)
        # The tokenizer.json derived from the ranks, handed over by the process that chose
        # fastokens (deriving Llama 3's took 1.6 s of a worker's start); None: not handed.
        self._derived: str | None = None

    def load_backend(self, name: str) -> PiecedBackend:
        from input_server.data.tokenizers.fast import DERIVED, Fastokens, derived_fields

        self.model()  # its checks first
        keep = self.router.keep
        derived = self._derived
        fields = derived_fields(self.digest(), PATTERN)
        kept = None if derived is not None or keep is None else keep.get(DERIVED, fields)
        if kept is not None:
            derived = kept.decode()
            self.router.note_cache_read("its tokenizer.json derived from the ranks")
        fast = Fastokens.from_tiktoken(
            self.spec.model,
            PATTERN,
            lambda: read_ranks(self.spec.model, self.written),
            shorten(self.written),
            derived,
        )
        if derived is None and fast.derived is not None and keep is not None:
            keep.put(DERIVED, fields, fast.derived.encode())
        return PiecedBackend(fast)

    def __getstate__(self):
        state = super().__getstate__()
        fast = self.router.backend
        if fast is not None and fast.derived is not None:
            state["_derived"] = fast.derived
        return state

    def _load(self):
        """The Encoding, shared by this process's tokenizers of the file as it stands: reading
        Llama 3's ranks into one took 0.3-0.4 s of every later stream's first batch."""
        enc, self._ids = _LOADED.get(self.spec.model, self._read)
        return enc

    def _read(self):
        import tiktoken

        check_readable(self.spec.model, self.written)
        refuse_tekken(self.spec.model, self.written, self.KIND)
        ranks = read_ranks(self.spec.model, self.written)
        if len(set(ranks.values())) != len(ranks):
            raise InvalidSpecError(
                f"`tokenizer.model` {shorten(self.written)!r} gives one rank to several tokens."
            )
        base = len(ranks)  # where MaxText numbers the specials from, gaps in the ranks or not
        try:
            enc = tiktoken.Encoding(
                name=os.path.basename(self.spec.model),
                pat_str=PATTERN,
                mergeable_ranks=ranks,
                special_tokens={t: base + i for i, t in enumerate(SPECIALS)},
            )
        except (ValueError, OverflowError) as e:
            raise InvalidSpecError(
                f"`tokenizer.model` {shorten(self.written)!r} is not a usable tiktoken model ({e})."
            ) from None
        return enc, (base, base + 1)

    def info(self) -> IdsInfo:
        enc = self.model()
        bos, eos = self._ids
        return IdsInfo(enc.n_vocab, bos, eos, -1, -1)

    def _encode(self, texts: list[str], *, add_bos: bool, add_eos: bool) -> list[np.ndarray]:
        core = self.model()._core_bpe  # see encode_buffer
        info = self.info()
        # Made once a group: each document's parts are its own arrays, not copies of these.
        head = np.asarray([info.bos_id] if add_bos else [], np.int32)
        tail = np.asarray([info.eos_id] if add_eos else [], np.int32)
        out = []
        for text in texts:
            parts = [head]
            for piece in pieces(text):
                buf = encode_buffer(core, piece)
                parts.append(np.frombuffer(buf, dtype=np.uint32).astype(np.int32))
            parts.append(tail)
            out.append(np.concatenate(parts))
        return out

    def limit_calls(self, threads: int) -> dict[str, LimitCall]:
        enc = self.model()
        core = enc._core_bpe  # see encode_buffer
        extra = int(self.spec.add_bos) + int(self.spec.add_eos)

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
        enc, info, spec = self.model(), self.info(), self.spec

        def encode(s: str) -> list[int]:  # TikTokenTokenizer.encode, as written
            substrs = (
                substr
                for i in range(0, len(s), MAX_ENCODE_CHARS)
                for substr in split_runs(s[i : i + MAX_ENCODE_CHARS], MAX_RUN)
            )
            t: list[int] = []
            for substr in substrs:
                t.extend(enc.encode(substr, allowed_special=set(), disallowed_special=()))
            if spec.add_bos:
                t.insert(0, info.bos_id)
            if spec.add_eos:
                t.append(info.eos_id)
            return t

        return encode
