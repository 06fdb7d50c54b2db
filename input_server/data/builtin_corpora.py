"""The corpora that ship with Python, as real text offline: the standard library's docstrings
(many short documents; the demo's corpus) and pydoc's topics (few long ones), written as jsonl
with a sentencepiece model trained on them.

Every Python install carries them, so nothing is downloaded: `input-server demo` builds its
corpus and model here (once, then cached), `input-server bench --builtin` measures on them, and
the tests and scripts take their fixtures from here.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import sysconfig

from input_server.data.tokenizers.trainers import train_sentencepiece

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


def write_jsonl(docs: list[str], path: str | os.PathLike, text_field: str = "text") -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, text_field: doc}) + "\n")
    return os.fspath(path)


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
