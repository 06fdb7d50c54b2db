"""A sentencepiece model trained on the user's own corpus files (`input-server tokenizer train`),
made as the server expects it (pad 0, bos 1, eos 2, unk 3), keeping whitespace and falling back
to bytes as language models' tokenizers do."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from input_server.data.records import loads_json, text_of
from input_server.data.tokenizers.train_progress import PROGRESS_EVERY_S, Progress
from input_server.data.tokenizers.trainers import train_sentencepiece
from input_server.errors import DataNotFoundError, InputServerError, RecordError

COMPRESSED = (".gz", ".zst", ".zstd")
JSONL = (".jsonl", ".json", ".ndjson")
# sentencepiece skips a "sentence" over 4192 bytes (its max_sentence_length); a longer line is
# cut at spaces into pieces of at most this many characters (4 bytes each at worst in UTF-8).
MAX_PIECE_CHARS = 1000
DEFAULT_VOCAB = 8000  # sentencepiece's own default
# sentencepiece's normalization rules. "identity" (Llama's, Gemma's) keeps every character,
# newlines and tabs included; the NFKC ones rewrite compatibility characters, and the nmt_
# ones also turn newlines and tabs into spaces.
NORMALIZATIONS = ("identity", "nfkc", "nmt_nfkc", "nfkc_cf", "nmt_nfkc_cf")


class TrainError(InputServerError):
    """A user mistake in `tokenizer train`: one line, exit 2."""


def file_format(path: str) -> str:
    """ "jsonl" for .jsonl/.json/.ndjson (compressed or not), else "text" (a document a line)."""
    name = path
    for ext in COMPRESSED:
        name = name.removesuffix(ext)
    return "jsonl" if name.endswith(JSONL) else "text"


@contextlib.contextmanager
def _open_binary(path: str) -> Iterator[io.BufferedIOBase]:
    """`path` decompressed as a stream (never whole in memory): plain, .gz or .zst."""
    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "no such file"
        raise DataNotFoundError(f"corpus {path}: {what}.")
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            yield f
    elif path.endswith((".zst", ".zstd")):
        import zstandard

        with (
            open(path, "rb") as raw,
            zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as z,
        ):
            yield io.BufferedReader(z)
    else:
        with open(path, "rb") as f:
            yield f


def _read_errors() -> tuple[type[BaseException], ...]:
    try:
        from zstandard import ZstdError
    except ImportError:
        return (OSError, EOFError)
    return (OSError, EOFError, ZstdError)


def texts(path: str, *, fmt: str, text_field: str) -> Iterator[str]:
    """The documents of one corpus file, in order.

    Raises:
      DataNotFoundError: no such file.
      RecordError: a line that is not JSON, or has no string `text_field` (naming file and line).
    """
    with _open_binary(path) as f:
        try:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"{path} line {n}"
                if fmt == "text":
                    try:
                        yield raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise RecordError(f"{where}: not UTF-8 text ({e.reason}).") from None
                    continue
                try:
                    obj = loads_json(raw)
                except ValueError as e:
                    raise RecordError(
                        f"{where}: not valid JSON ({e}); plain text files need --format text."
                    ) from None
                yield text_of(obj, text_field, where).replace("\0", "")
        except _read_errors() as e:  # a damaged .gz (BadGzipFile, EOFError) or .zst
            raise RecordError(f"{path}: cannot be read ({e}).") from None


def pieces(line: str) -> Iterator[str]:
    """`line` cut at spaces into pieces sentencepiece does not skip for their length."""
    while len(line) > MAX_PIECE_CHARS:
        cut = line.rfind(" ", 1, MAX_PIECE_CHARS)
        cut = cut if cut > 0 else MAX_PIECE_CHARS
        yield line[:cut]
        line = line[cut:]
    if line.strip():
        yield line


class _Corpus:
    """The training lines of every file, counted; an error while sentencepiece reads is kept
    (sentencepiece would turn it into a RuntimeError quoting a stack) and raised after."""

    def __init__(self, paths: list[str], *, fmt: str, text_field: str, progress: Progress):
        self.paths, self.fmt, self.text_field = paths, fmt, text_field
        self.progress = progress
        self.documents = self.lines = 0
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            for path in self.paths:
                self.progress.path = path
                fmt = file_format(path) if self.fmt == "auto" else self.fmt
                for doc in texts(path, fmt=fmt, text_field=self.text_field):
                    self.documents += 1
                    self.progress.documents = self.documents
                    for line in doc.splitlines():
                        for piece in pieces(line):
                            self.lines += 1
                            self.progress.lines = self.lines
                            yield piece
        except Exception as e:
            self.error = e
            return
        self.progress.trained = True


def _check_first_records(paths: list[str], fmt: str, text_field: str) -> None:
    """Each file opens and its first record has the text field: a mistake in the command
    line fails in a moment, before a training run that reads everything."""
    for path in paths:
        for _ in texts(
            path, fmt=file_format(path) if fmt == "auto" else fmt, text_field=text_field
        ):
            break


def _sentencepiece_says(e: RuntimeError, vocab_size: int) -> str:
    text = str(e)
    if m := re.search(
        r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", text
    ):
        return (
            f"--vocab-size {vocab_size} is more than this corpus supports (at most "
            f"{m.group(2)}); pass --vocab-size {m.group(2)} or less, or train on more text."
        )
    if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", text):
        return (
            f"--vocab-size {vocab_size} is too small: the corpus has more distinct characters "
            f"than that; pass at least --vocab-size {m.group(2)}."
        )
    last = [line for line in text.splitlines() if line.strip()][-1:] or [text]
    return f"sentencepiece could not train: {last[0].strip()}"


def train(
    corpora: list[str],
    output: str,
    *,
    vocab_size: int = DEFAULT_VOCAB,
    model_type: str = "unigram",
    text_field: str = "text",
    fmt: str = "auto",
    with_pad: bool = True,
    normalization: str = "identity",
    keep_whitespace: bool = True,
    byte_fallback: bool = True,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> dict:
    """Trains a model on `corpora` and writes it to `output` (nothing else: no .vocab file);
    returns what it made, checked by loading it as the server does.

    By default the model keeps text as it was: no normalization, whitespace runs kept, and
    characters it has no piece for (a newline: the corpus is trained a line at a time) as
    their UTF-8 bytes, so code and indentation decode back exactly.

    Raises:
      DataNotFoundError: a corpus file or the output's folder does not exist.
      RecordError: a record without the text field, or not JSON (file and line named).
      TrainError: no text, or a vocabulary the corpus cannot give.
    """
    folder = _output_folder(corpora, output)
    _check_first_records(corpora, fmt, text_field)
    progress = Progress(progress_every_s)
    corpus = _Corpus(corpora, fmt=fmt, text_field=text_field, progress=progress)
    work = tempfile.mkdtemp(prefix=".spm-", dir=folder)  # same file system: an atomic rename
    options = {
        "model_type": model_type,
        "with_pad": with_pad,
        "normalization": normalization,
        "keep_whitespace": keep_whitespace,
        "byte_fallback": byte_fallback,
    }
    try:
        model = _train_corpus(corpus, os.path.join(work, "spm"), text_field, vocab_size, options)
        os.replace(model, output)
    finally:
        progress.close()
        shutil.rmtree(work, ignore_errors=True)
    return _made(output, corpus, options)


def _output_folder(corpora: list[str], output: str) -> str:
    """The folder `output` is written in, after checking `output` names a model file.

    Raises:
      DataNotFoundError: no such folder.
      TrainError: `output` is a folder or one of `corpora`.
    """
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise DataNotFoundError(f"-o {output}: no such folder {folder}.")
    if os.path.isdir(output):
        raise TrainError(f"-o {output}: is a folder; name the model file, e.g. {output}/spm.model.")
    for path in corpora:
        if os.path.exists(output) and os.path.exists(path) and os.path.samefile(output, path):
            raise TrainError(f"-o {output}: is one of the corpus files; name another model file.")
    return folder


def _train_corpus(
    corpus: _Corpus, prefix: str, text_field: str, vocab_size: int, options: dict[str, Any]
) -> str:
    """Trains on `corpus` into `prefix`.model and returns its path; a corpus that could not
    be read, or sentencepiece's refusal, raised as the error that says why."""
    try:
        model = train_sentencepiece(
            corpus,
            prefix,
            vocab_size=vocab_size,
            exact_vocab=True,  # the vocabulary asked for, or a clear no
            num_threads=os.cpu_count() or 1,
            **options,  # as `train` was given them
        )
    except RuntimeError as e:
        if corpus.error is not None:
            raise corpus.error from None
        if not corpus.lines:
            raise TrainError(
                f"no text in {' '.join(corpus.paths)} (field {text_field!r})."
            ) from None
        raise TrainError(_sentencepiece_says(e, vocab_size)) from None
    if corpus.error is not None:
        raise corpus.error
    return model


def _made(output: str, corpus: _Corpus, options: dict[str, Any]) -> dict:
    """What `train` made, read back by loading the model as the server does."""
    from input_client.spec import TokenizerSpec
    from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer

    tok = SentencepieceTokenizer(TokenizerSpec(model=os.path.abspath(output)))
    sp = tok.model()
    return {
        "model": output,
        "model_type": options["model_type"],
        "vocab_size": tok.vocab_size,
        "pad_id": sp.pad_id(),
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "unk_id": sp.unk_id(),
        "documents": corpus.documents,
        "lines": corpus.lines,
        "files": len(corpus.paths),
        "normalization": options["normalization"],
        "keep_whitespace": options["keep_whitespace"],
        "byte_fallback": options["byte_fallback"],
    }
