"""A loaded model is shared by every tokenizer of its file in the process (`LoadedModels`), a
changed file loads anew, and the least recently used model is dropped past the cap: for the
tiktoken and tekken kinds, on files written from ranks trained on real text."""

from __future__ import annotations

import shutil

import pytest

from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.loaded import MAX_LOADED, LoadedModels
from input_server.data.tokenizers.tiktoken import read_ranks
from input_server.data.tokenizers.trainers import write_tekken_model, write_tiktoken_model
from input_server.errors import InvalidSpecError

WRITERS = {"tiktoken": write_tiktoken_model, "tekken": write_tekken_model}


@pytest.fixture(scope="module")
def ranks_files(docs, tmp_path_factory) -> list[str]:
    """Three tiktoken files of different ranks."""
    d = tmp_path_factory.mktemp("ranks")
    return [
        write_tiktoken_model(docs[:100], d / f"m{size}.tiktoken", vocab_size=size)
        for size in (280, 300, 320)
    ]


def _model(path: str, kind: str):
    return load_tokenizer(TokenizerSpec(model=path, kind=kind)).model()


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_tokenizers_of_one_file_share_its_loaded_model(kind, docs, tmp_path):
    path = WRITERS[kind](docs[:100], tmp_path / "model", vocab_size=300)
    assert _model(path, kind) is _model(path, kind)


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_changed_file_loads_anew(kind, docs, tmp_path):
    path = WRITERS[kind](docs[:100], tmp_path / "model", vocab_size=300)
    before = load_tokenizer(TokenizerSpec(model=path, kind=kind))
    WRITERS[kind](docs[:100], path, vocab_size=340)  # rewritten in place, more ranks
    after = load_tokenizer(TokenizerSpec(model=path, kind=kind))
    assert after.model() is not before.model()
    assert after.info().vocab_size > before.info().vocab_size


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_past_the_cap_the_first_file_loaded_is_dropped(kind, docs, tmp_path):
    first = WRITERS[kind](docs[:100], tmp_path / "model0", vocab_size=300)
    copies = [str(shutil.copy(first, tmp_path / f"model{i}")) for i in range(1, MAX_LOADED + 1)]
    kept = _model(first, kind)
    for path in copies[:-1]:
        _model(path, kind)
    assert _model(first, kind) is kept  # the cap's worth of files: all still held
    # The last use made `first` the most recent; the next file drops the least recent copy.
    _model(copies[-1], kind)
    assert _model(first, kind) is kept
    for path in copies:
        _model(path, kind)
    assert _model(first, kind) is not kept


class _Counted:
    """`read_ranks` of real files, counting the reads."""

    def __init__(self):
        self.reads: list[str] = []

    def loader(self, path: str):
        def load():
            self.reads.append(path)
            return read_ranks(path, path)

        return load


def test_the_least_recently_used_is_dropped_past_the_cap(ranks_files):
    loaded, counted = LoadedModels(cap=2), _Counted()
    a, b, c = ranks_files
    ranks_a = loaded.get(a, counted.loader(a))
    loaded.get(b, counted.loader(b))
    assert loaded.get(a, counted.loader(a)) is ranks_a  # now b is the least recent
    loaded.get(c, counted.loader(c))
    assert len(loaded) == 2 and counted.reads == [a, b, c]
    assert loaded.get(a, counted.loader(a)) is ranks_a
    loaded.get(b, counted.loader(b))
    assert counted.reads == [a, b, c, b]


def test_a_failed_load_keeps_nothing(tmp_path, ranks_files):
    loaded, counted = LoadedModels(), _Counted()
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not a rank line\n")
    for _ in range(2):
        with pytest.raises(InvalidSpecError, match="is not a tiktoken BPE file"):
            loaded.get(str(bad), counted.loader(str(bad)))
    assert len(loaded) == 0 and counted.reads == [str(bad)] * 2


def test_the_cap_must_be_positive():
    with pytest.raises(ValueError, match="`cap` must be positive, got 0"):
        LoadedModels(cap=0)
