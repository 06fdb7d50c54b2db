"""Mistral's tekken files (`kind = "tekken"`) give mistral-common's own ids: the `Tekkenizer`
loading the same file is the reference, on the tekken files mistral-common ships (Mistral NeMo's
and Pixtral's) and on files written here from ranks trained on real text; what mistral-common
refuses is refused by name, and every other kind that meets a tekken file says what it is."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from input_client.spec import TokenizerSpec
from input_server.data.builtin_corpora import pydoc_topics
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.checks import looks_like
from input_server.data.tokenizers.tekken import OLD_SPECIALS, PATTERN
from input_server.data.tokenizers.trainers import (
    train_hf_tokenizer,
    train_sentencepiece,
    write_tekken_model,
    write_tiktoken_model,
)
from input_server.errors import InvalidSpecError
from tests.support.tokens import doc_tokens

tekken_ref = pytest.importorskip("mistral_common.tokens.tokenizers.tekken")

# What a tokenizer is most likely to get wrong beside prose: special-token text (text here, as
# in mistral-common's encode), marks, emoji, CJK, line ends, digits, a lone surrogate, a long
# run of spaces, nothing.
HARD = [
    "",
    " ",
    "<s> [INST] hello [/INST] </s> <pad> <unk> [IMG] <SPECIAL_500> [TOOL_CALLS]",
    "Ünïcödé café naïve e\u0301 a\u0308b \u0915\u094d\u0937",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦",
    "中文字符测试，日本語のテキスト、한국어 텍스트。",
    "line one\r\nline two\r\n\r\n\tindented\n \n",
    "1234567890 3.14159 -42 1,000,000 0x1F",
    "a lone \ud800 surrogate",
    "x" + " " * 30_000 + "y",
    "CamelCaseWords and ALLCAPS then MixedCASEword",
]
FLAGS = [(True, True), (False, True), (True, False), (False, False)]


def shipped(name: str) -> str:
    """A tekken file mistral-common ships (its own tests' data)."""
    import mistral_common

    return os.path.join(os.path.dirname(mistral_common.__file__), "data", name)


def doc_ids(group, i) -> list[int]:
    return doc_tokens(group, i).tolist()


@pytest.fixture(scope="module")
def texts(docs) -> list[str]:
    """Real text: the docstrings, pydoc's long topics, and the hard cases."""
    return [*docs, *pydoc_topics(), *HARD]


@pytest.fixture(scope="module")
def written(docs, tmp_path_factory) -> str:
    """A v7 tekken file of ranks trained on the docstrings: six listed specials of 1000 (the
    rest mistral-common's fillers), fewer ranks used than the file holds."""
    path = tmp_path_factory.mktemp("tekken") / "tekken.json"
    return write_tekken_model(docs[:600], path, vocab_size=900, keep=800)


@pytest.mark.parametrize(
    "name",
    ["tekken_240911.json", "tekken_240718.json", "trained"],
    ids=["nemo", "pixtral", "trained-ranks"],
)
def test_each_tekken_file_gives_the_tekkenizers_ids(name, texts, request):
    """Mistral NeMo's and Pixtral's tekken, and a file of ranks trained here (listed specials,
    fillers and ranks cut to `default_vocab_size`): every id, BOS/EOS as each flag pair asks,
    and the special ids DescribeTokenizer reports, are mistral-common's."""
    path = request.getfixturevalue("written") if name == "trained" else shipped(name)
    ref = tekken_ref.Tekkenizer.from_file(path)
    for bos, eos in FLAGS:
        tok = load_tokenizer(TokenizerSpec(model=path, kind="tekken", add_bos=bos, add_eos=eos))
        group = tok.encode(texts)
        for i, text in enumerate(texts):
            assert doc_ids(group, i) == ref.encode(text, bos, eos), (bos, eos, i)
    info = tok.info()
    assert (info.vocab_size, info.bos_id, info.eos_id, info.pad_id, info.unk_id) == (
        ref.n_words,
        ref.bos_id,
        ref.eos_id,
        ref.pad_id,
        ref.unk_id,
    )


def test_a_file_of_trained_ranks_numbers_them_as_mistral_common(written):
    """Listed specials, fillers and ranks cut to `default_vocab_size`, as mistral-common
    numbers them; special-token text in a document stays text."""
    ref = tekken_ref.Tekkenizer.from_file(written)
    spec = TokenizerSpec(model=written, kind="tekken", add_bos=False, add_eos=False)
    tok = load_tokenizer(spec)
    info = tok.info()
    assert (info.vocab_size, ref.n_words, ref.num_special_tokens) == (1800, 1800, 1000)
    assert (info.bos_id, info.eos_id, info.pad_id, info.unk_id) == (1, 2, 5, 0)
    ids = doc_ids(tok.encode(["<s>"]), 0)
    assert ids == ref.encode("<s>", False, False) and 1 not in ids and min(ids) >= 1000


def test_a_v3_file_without_special_tokens_numbers_mistral_commons_twenty(docs, tmp_path):
    path = write_tekken_model(
        docs[:300], tmp_path / "tekken.json", vocab_size=500, specials=None, version="v3"
    )
    ref = tekken_ref.Tekkenizer.from_file(path)
    tok = load_tokenizer(TokenizerSpec(model=path, kind="tekken"))
    info = tok.info()
    assert [ref.get_special_token(t) for t in OLD_SPECIALS] == list(range(len(OLD_SPECIALS)))
    assert (info.bos_id, info.eos_id, info.pad_id, info.unk_id) == (
        ref.bos_id,
        ref.eos_id,
        ref.pad_id,
        ref.unk_id,
    )
    assert doc_ids(tok.encode(docs[:5]), 3) == ref.encode(docs[3], True, True)


def test_trimmed_documents_keep_the_whole_documents_first_ids(written, texts):
    """Mistral's pattern is cut at a space between letters before tokenizing (the proof is in
    `tekken.py`): a trimmed document holds exactly the first ids of the whole."""
    tok = load_tokenizer(TokenizerSpec(model=written, kind="tekken"))
    with open(written, encoding="utf-8") as f:
        assert json.load(f)["config"]["pattern"] == PATTERN
    assert tok.cutter is not None
    long = [t for t in texts if len(t) > 5_000]
    whole = tok.encode(long)
    for trim_to in (1, 17, 300, 2_000):
        tok.learn_chars_per_token(long[:5])
        cut = tok.encode(long, trim_to=trim_to)
        for i in range(len(long)):
            assert doc_ids(cut, i) == doc_ids(whole, i)[:trim_to], (trim_to, i)
    assert tok.tokenized_chars(len(long[0]), 17) < len(long[0])


def test_a_pickled_tekken_tokenizer_reloads_its_file(written):
    tok = load_tokenizer(TokenizerSpec(model=written, kind="tekken"))
    again = pickle.loads(pickle.dumps(tok))
    text = ["Return the number of items in a container."]
    assert again.encode(text).tokens.tolist() == tok.encode(text).tokens.tolist()


def test_a_run_of_spaces_tiktokens_regex_cannot_split_is_refused_by_name(written):
    """mistral-common runs the same tiktoken call, which gives up on it too."""
    text = "x" + " " * 1_000_000 + "y"
    with pytest.raises(ValueError):
        tekken_ref.Tekkenizer.from_file(written).encode(text, False, False)
    for backend in ("reference", "fastokens"):  # fastokens' regex would split it: not asked
        tok = load_tokenizer(TokenizerSpec(model=written, kind="tekken", backend=backend))
        assert tok.choose_backend(["a few words", "and more"]).backend == backend
        with pytest.raises(InvalidSpecError, match="cannot split a document of 1,000,002 char"):
            tok.encode(["a few words", text])


def _changed(written: str, folder, change) -> str:
    with open(written, encoding="utf-8") as f:
        data = json.load(f)
    change(data)
    path = folder / "changed.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _node(data, keys: list[str]):
    """What the dotted path's `keys` lead to in the file's JSON."""
    for key in keys:
        data = data[int(key)] if isinstance(data, list) else data[key]
    return data


def _set(where: str, value):
    def change(data):
        *keys, last = where.split(".")
        node = _node(data, keys)
        if value is _DROP:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


def _copy(source: str, where: str):
    """A change that sets `where` to what `source` holds (dotted paths, as `_set`'s)."""

    def change(data):
        _set(where, _node(data, source.split(".")))(data)

    return change


def _both(*changes):
    def change(data):
        for c in changes:
            c(data)

    return change


_DROP = object()
# What mistral-common raises for a file it refuses: its checks are asserts, or its parsing's
# own errors.
REFUSES = (AssertionError, ValueError, KeyError)


@pytest.mark.parametrize(
    "change, needle, refuses",
    [
        (_set("config.version", "v8x"), "`config.version` is 'v8x'", REFUSES),
        (
            _both(_set("special_tokens", _DROP), _set("config.version", "v11")),
            "v11 needs a",
            REFUSES,
        ),
        (_set("special_tokens.1.token_str", "<unk>"), "'<unk>' is named twice", REFUSES),
        (
            _set("special_tokens.5.token_str", "<SPECIAL_40>"),
            "'<SPECIAL_40>' is named twice",
            REFUSES,
        ),
        (_set("config.default_num_special_tokens", 3), "holds 6, past 3 special tokens", REFUSES),
        (_set("config.default_vocab_size", 5000), "asks for 4000 ranks", REFUSES),
        (_set("vocab.300.rank", 7), "`vocab[300]` has rank 7, not 300", REFUSES),
        (_set("vocab.65.token_bytes", "Qg=="), "`vocab[65]` is not the byte 65", REFUSES),
        (_set("vocab.300.token_str", _DROP), "`vocab[300]` is", REFUSES),
        (
            _copy("vocab.300.token_bytes", "vocab.301.token_bytes"),
            "`vocab[301]` repeats the token of rank 300",
            AssertionError,
        ),
    ],
    ids=[
        "version",
        "specials-missing",
        "special-twice",
        "special-as-filler",
        "too-many-specials",
        "too-few-ranks",
        "rank-out-of-place",
        "not-the-byte",
        "entry-keys",
        "token-repeated",
    ],
)
def test_what_mistral_common_refuses_is_refused_by_name(written, tmp_path, change, needle, refuses):
    path = _changed(written, tmp_path, change)
    with pytest.raises(refuses):
        tekken_ref.Tekkenizer.from_file(path)
    with pytest.raises(InvalidSpecError, match="is not a tekken file the server can read") as e:
        load_tokenizer(TokenizerSpec(model=path, kind="tekken"))
    assert needle in str(e.value) and "changed.json" in str(e.value)


@pytest.fixture(scope="module")
def other_models(docs, tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("others")
    return {
        "sentencepiece": train_sentencepiece(docs[:300], d / "spm", vocab_size=400),
        "huggingface": os.path.join(
            train_hf_tokenizer(docs[:300], d / "hf", vocab_size=400), "tokenizer.json"
        ),
        "tiktoken": write_tiktoken_model(docs[:300], d / "m.tiktoken", vocab_size=400),
    }


@pytest.mark.parametrize("kind", ["sentencepiece", "huggingface", "tiktoken"])
def test_every_other_kind_says_a_tekken_file_is_tekkens(kind, written):
    """In one line, before its own parser would fail on it (Hugging Face's said only "expected
    `,` or `}` at line 2 column 13", the others pointed to Hugging Face)."""
    for path in (written, shipped("tekken_240911.json")):
        with pytest.raises(InvalidSpecError) as e:
            load_tokenizer(TokenizerSpec(model=path, kind=kind))
        message = str(e.value)
        assert "is a Mistral tekken tokenizer" in message and 'set `kind = "tekken"`' in message
        assert f"the {kind} kind does not read" in message and "\n" not in message


@pytest.mark.parametrize("kind", ["sentencepiece", "huggingface", "tiktoken"])
def test_the_tekken_kind_names_another_kinds_file(kind, other_models):
    with pytest.raises(InvalidSpecError, match=f'set `kind = "{kind}"`'):
        load_tokenizer(TokenizerSpec(model=other_models[kind], kind="tekken"))


def test_a_tekken_file_is_recognized_whichever_key_comes_first(written, tmp_path):
    assert looks_like(written) == "tekken"
    with open(written, encoding="utf-8") as f:
        data = json.load(f)
    vocab_first = tmp_path / "vocab_first.json"
    vocab_first.write_text(json.dumps({"vocab": data["vocab"], "config": data["config"]}))
    assert looks_like(str(vocab_first)) == "tekken"
    # A Hugging Face tokenizer.json's vocabulary is inside `model`; a `pattern` inside another
    # top-level object is not a tekken config.
    hf = tmp_path / "tokenizer.json"
    hf.write_text(json.dumps({"model": {"vocab": {"a": 0}}, "added_tokens": [{"pattern": 1}]}))
    assert looks_like(str(hf)) == "huggingface"
    broken = tmp_path / "broken.json"
    broken.write_text('{"config": ')
    assert looks_like(str(broken)) == "huggingface"


def test_the_limit_calls_and_the_reference_encoder_count_what_encode_gives(written, texts):
    tok = load_tokenizer(TokenizerSpec(model=written, kind="tekken"))
    sample = texts[:60]
    lengths = tok.encode(sample).lengths.tolist()
    for name, call in tok.limit_calls(2).items():
        assert call(sample) == lengths, name
    ref = tekken_ref.Tekkenizer.from_file(written)
    assert tok.maxtext_encoder()(sample[3]) == ref.encode(sample[3], True, True)
    assert np.array_equal(tok.encode(sample[3:4]).tokens, ref.encode(sample[3], True, True))


def test_fastokens_passes_the_gate_on_mistrals_file_and_serves_the_tekkenizers_ids(texts):
    """Over a tokenizer.json derived from the ranks, its ids moved past the special tokens; a
    worker process is handed the derived text with the tokenizer. (A lone surrogate, which
    fastokens cannot take, sends its group to the reference.)"""
    path = shipped("tekken_240911.json")
    ref = tekken_ref.Tekkenizer.from_file(path)
    tok = load_tokenizer(TokenizerSpec(model=path, kind="tekken", backend="fastokens"))
    assert tok.choose_backend(texts[:64]).backend == "fastokens"
    texts = [t for t in texts if "\ud800" not in t]
    group = tok.encode(texts)
    assert group.by_backend and not group.fell_back
    for i, text in enumerate(texts):
        assert doc_ids(group, i) == ref.encode(text, True, True), i
    again = pickle.loads(pickle.dumps(tok))
    assert again.choice.backend == "fastokens"
    assert again.encode(texts[:50]).same_ids(tok.encode(texts[:50]))
