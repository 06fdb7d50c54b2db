"""`serve --token-cache` keys on what a source's bytes are: a file rewritten in place with its
size and modification time kept (as `cp -p`, `rsync -t` or a restored backup leave it) is read
and tokenized again, every batch as a server without the cache makes it; an unchanged file is
still served from the cache. Real servers (`input-server serve`) on Unix sockets, real files, a
real sentencepiece model, a real SQLite cache folder."""

from __future__ import annotations

import os
import re

import pytest

from input_client import InputClient
from input_server.data.builtin_corpora import write_jsonl
from tests.support import assert_same_batches, first_difference, serve_files

_PREFIX = b'{"id": '


def _write(docs: list[str], folder) -> str:
    """The documents as jsonl, each text letters, digits and spaces only, so that swapping
    the case of its letters keeps every line's length (and the JSON valid)."""
    os.makedirs(folder, exist_ok=True)
    plain = [re.sub(r"[^A-Za-z0-9 ]", " ", d) for d in docs]
    return write_jsonl(plain, os.path.join(folder, "docs.jsonl"))


def _rewrite_in_place(path: str) -> None:
    """Another text in the same file, the same size, its modification time set back to the
    old nanosecond: what a size-and-mtime check cannot tell apart."""
    before = os.stat(path)
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    out = []
    for line in lines:
        head, sep, text = line.partition(b'"text": "')
        assert head.startswith(_PREFIX) and sep, line
        out.append(head + sep + text.swapcase())  # the key is before `sep`, untouched
    with open(path, "r+b") as f:  # in place: the same inode, as `cp -p` over it leaves it
        f.write(b"".join(out))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )


def _tokenize_s(client: InputClient) -> float:
    """The server's tokenizing seconds so far, over all its streams."""
    return {s.stage: s.seconds for s in client.info().totals.stages}.get("tokenize", 0.0)


def _stream(client: InputClient, spec) -> tuple[list, float]:
    """Every batch of one stream, and the seconds the server spent tokenizing for it."""
    before = _tokenize_s(client)
    with client.batches(spec) as it:
        batches = [{k: v.copy() for k, v in b.items()} for b in it]
    return batches, _tokenize_s(client) - before


class _Server:
    """`input-server serve` of the data and model with `flags`, named anew in `tmp`."""

    def __init__(self, tmp, data: str, model: str, *flags: str):
        name = f"s{len(os.listdir(tmp))}"
        self.child, target = serve_files(tmp, data, model, flags=flags, name=name)
        self.log = os.path.join(tmp, f"{name}.log")
        self.client = InputClient(target, connect_timeout_s=30)

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.child.kill()


@pytest.fixture
def data(tmp_path, docs):
    return _write(docs[:400], tmp_path / "data")


def _spec(make_spec, path: str, epochs: int = 2):
    return make_spec(source={"paths": [path]}, order={"epochs": epochs})


def _plain(tmp, data, spm_model, spec) -> list:
    """The batches a server without the cache makes of the file as it is now."""
    with _Server(tmp, data, spm_model) as s:
        return _stream(s.client, spec)[0]


def test_a_restarted_server_tokenizes_a_rewritten_file_and_reads_an_unchanged_one_back(
    tmp_path, data, spm_model, make_spec
):
    spec = _spec(make_spec, data)
    cache = ("--token-cache", str(tmp_path / "cache"))
    old = _plain(tmp_path, data, spm_model, spec)
    with _Server(tmp_path, data, spm_model, *cache) as s:
        first, tokenized = _stream(s.client, spec)
    assert_same_batches(first, old)
    assert tokenized > 0
    _rewrite_in_place(data)
    new = _plain(tmp_path, data, spm_model, spec)
    assert first_difference(new, old) is not None  # the rewrite changes the batches
    # Restarted on the same cache: the rewritten file is digested anew, and tokenized.
    with _Server(tmp_path, data, spm_model, *cache) as s:
        again, tokenized = _stream(s.client, spec)
    assert_same_batches(again, new)
    assert tokenized > 0
    # Restarted once more, nothing changed: every group is a hit, nothing is tokenized.
    with _Server(tmp_path, data, spm_model, *cache) as s:
        hit, tokenized = _stream(s.client, spec)
    assert_same_batches(hit, new)
    assert tokenized == 0.0


def test_one_server_tokenizes_a_file_rewritten_between_two_streams(
    tmp_path, data, spm_model, make_spec
):
    spec = _spec(make_spec, data, epochs=1)
    cache = ("--token-cache", str(tmp_path / "cache"))
    with _Server(tmp_path, data, spm_model, *cache) as s:
        old, tokenized = _stream(s.client, spec)
        assert tokenized > 0
        _, tokenized = _stream(s.client, spec)
        assert tokenized == 0.0  # the file's digest remembered, its ids found
        _rewrite_in_place(data)
        got, tokenized = _stream(s.client, spec)
        assert tokenized > 0
        hit, tokenized = _stream(s.client, spec)  # the new text's ids, kept by the last
        assert tokenized == 0.0
    new = _plain(tmp_path, data, spm_model, spec)
    assert first_difference(new, old) is not None
    assert_same_batches(got, new)
    assert_same_batches(hit, new)


def test_a_named_pipeline_is_not_served_the_ids_of_its_file_before_a_rewrite(
    tmp_path, data, spm_model
):
    """A named pipeline is opened (and its files digested) once, at the server's start; each
    later stream checks its files again as it opens."""
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(
        f'[named.source]\npaths = ["{data}"]\n[named.tokenizer]\nmodel = "{spm_model}"\n'
        "[named.batch]\nseq_len = 128\nsize = 4\n[named.order]\nepochs = 1\n"
        "[named.workers]\ncount = 0\n"
    )
    named = ("--pipelines", str(pipelines))
    with _Server(tmp_path, data, spm_model, *named) as plain:
        old = _stream(plain.client, "named")[0]
        _rewrite_in_place(data)
        new = _stream(plain.client, "named")[0]
    assert first_difference(new, old) is not None
    _rewrite_in_place(data)  # back to the first text (swapped twice)
    cache = ("--token-cache", str(tmp_path / "cache"))
    with _Server(tmp_path, data, spm_model, *named, *cache) as s:
        first, tokenized = _stream(s.client, "named")
        assert_same_batches(first, old)
        _, tokenized = _stream(s.client, "named")
        assert tokenized == 0.0  # unchanged: served from the cache
        _rewrite_in_place(data)
        got, tokenized = _stream(s.client, "named")
        assert tokenized > 0
    assert_same_batches(got, new)
    with open(s.log, encoding="utf-8") as f:
        assert "changed since its pipeline digested it" in f.read()
