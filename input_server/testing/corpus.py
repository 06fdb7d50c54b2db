"""A real-text corpus and sentencepiece model built offline from the Python standard library.

The demo and the tests use it: the standard library's docstrings are real English prose that
every Python install carries, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import sysconfig
import tempfile
from collections.abc import Iterable

MIN_CHARS = 40


def _parse(text: str) -> ast.Module:
    """`ast.parse`, again if another thread's parse raced it: CPython 3.11's AST conversion
    keeps one recursion count for the whole process (3.11's tracebacks parse their source
    lines too, so a server thread logging one meanwhile trips it: "AST constructor recursion
    depth mismatch", a SystemError, in test fixtures beside a running server)."""
    for _ in range(5):
        try:
            return ast.parse(text)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e):
                raise
    return ast.parse(text)


def stdlib_docstrings(max_docs: int | None = None) -> list[str]:
    """Docstrings of the standard library's modules, classes and functions, in a fixed order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] in ("site-packages", "dist-packages") or "test" in rel or "tests" in rel:
            continue
        try:
            tree = _parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_CHARS:
                    docs.append(doc)
                    if max_docs is not None and len(docs) >= max_docs:
                        return docs
    return docs


def pydoc_topics() -> list[str]:
    """The Python documentation's help topics (`pydoc_data`): few, long documents."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


BUILTIN_CORPORA = {"stdlib-docstrings": stdlib_docstrings, "pydoc-topics": pydoc_topics}


def build_builtin(
    name: str, directory: str | os.PathLike, *, vocab_size: int = 1000
) -> tuple[str, str]:
    """Writes a builtin corpus as jsonl and trains its tokenizer; returns (jsonl, model)."""
    docs = BUILTIN_CORPORA[name]()
    corpus = write_jsonl(docs, os.path.join(directory, f"{name}.jsonl"))
    return corpus, train_sentencepiece(docs, os.path.join(directory, name), vocab_size=vocab_size)


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark scripts' corpus options: a jsonl file and model, or a builtin corpus."""
    parser.add_argument("--corpus", help="jsonl file with a 'text' field")
    parser.add_argument("--model", help="sentencepiece model")
    parser.add_argument(
        "--builtin",
        choices=sorted(BUILTIN_CORPORA),
        help="a corpus that ships with Python; its tokenizer is trained here",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=1000,
        help="vocabulary of the tokenizer trained for --builtin",
    )


def corpus_from_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[str, str]:
    """(jsonl, model) from `add_corpus_arguments`' options; a builtin is built in a fresh
    temporary folder. Exits through `parser.error` when neither is given."""
    if args.builtin:
        return build_builtin(
            args.builtin, tempfile.mkdtemp(prefix="bench-"), vocab_size=args.vocab_size
        )
    if not (args.corpus and args.model):
        parser.error("give --corpus and --model, or --builtin")
    return args.corpus, args.model


def write_jsonl(docs: list[str], path: str | os.PathLike, text_field: str = "text") -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, text_field: doc}) + "\n")
    return os.fspath(path)


def train_sentencepiece(
    docs: Iterable[str],
    model_prefix: str | os.PathLike,
    *,
    vocab_size: int = 1000,
    model_type: str = "unigram",
    with_pad: bool = True,
    exact_vocab: bool = False,
    num_threads: int = 2,
    keep_whitespace: bool = False,
    byte_fallback: bool = False,
    normalization: str = "nmt_nfkc",
) -> str:
    """Trains a small model (sentencepiece's default unigram, or "bpe"); returns its path.

    The defaults are sentencepiece's (NFKC, whitespace runs collapsed, unknown characters
    to unk), which the demo and the tests' fixture models were made with. `keep_whitespace`,
    `byte_fallback` and `normalization="identity"` make a model as Llama's and Gemma's are:
    every space, tab and newline decodes back as it was (a newline or a character the corpus
    lacks as its UTF-8 bytes).

    `with_pad=False` leaves out the pad piece, as Llama 2's model does (`pad_id()` is -1).
    `exact_vocab=True` makes a corpus too small for `vocab_size` an error (sentencepiece's
    RuntimeError names the most it supports) instead of a smaller vocabulary.
    """
    import sentencepiece as spm

    # Train on lines: sentencepiece skips "sentences" over 4192 bytes, and caps their count.
    lines = (line for doc in docs for line in doc.splitlines() if line.strip())
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines,
        model_prefix=os.fspath(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        # 0 stays padding for the batches (MaxText's convention); unk moves to 3.
        **(
            dict(pad_id=0, bos_id=1, eos_id=2, unk_id=3)
            if with_pad
            else dict(pad_id=-1, bos_id=1, eos_id=2, unk_id=0)
        ),
        input_sentence_size=200000,
        shuffle_input_sentence=True,
        num_threads=num_threads,
        hard_vocab_limit=exact_vocab,  # else a small corpus gets the vocabulary it supports
        normalization_rule_name=normalization,
        remove_extra_whitespaces=not keep_whitespace,
        byte_fallback=byte_fallback,
        minloglevel=2,
    )
    return f"{os.fspath(model_prefix)}.model"


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "input-server"


def ensure_demo_assets(
    directory: str | os.PathLike | None = None, *, max_docs: int = 20000, vocab_size: int = 1000
) -> tuple[str, str]:
    """Builds (once, then cached) the docstring corpus and its tokenizer; returns their paths."""
    d = pathlib.Path(directory) if directory else cache_dir() / f"demo-{max_docs}-{vocab_size}"
    d.mkdir(parents=True, exist_ok=True)
    corpus, model = d / "corpus.jsonl", d / "spm.model"
    if not (corpus.exists() and model.exists()):
        docs = stdlib_docstrings(max_docs)
        tmp = d / "corpus.jsonl.tmp"
        write_jsonl(docs, tmp)
        train_sentencepiece(docs, d / "spm", vocab_size=vocab_size)
        os.replace(tmp, corpus)  # last, so a half-built cache is never taken as complete
    return os.fspath(corpus), os.fspath(model)
