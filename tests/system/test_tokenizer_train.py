"""`input-server tokenizer train`: models from jsonl (plain, .gz, .zst) and text that a real
server streams with, and advice in its refusals that works when followed."""

from __future__ import annotations

import gzip
import re
import shutil

import pytest
import sentencepiece as spm

from input_client import InputClient, PipelineSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.serving.server import Server, ServerConfig
from tests.support import run_main


def _write(docs, tmp_path, kind: str) -> str:
    plain = write_jsonl(docs, tmp_path / "docs.jsonl")
    if kind == "jsonl":
        return plain
    if kind == "gz":
        with open(plain, "rb") as f, gzip.open(tmp_path / "docs.jsonl.gz", "wb") as g:
            shutil.copyfileobj(f, g)
        return str(tmp_path / "docs.jsonl.gz")
    if kind == "zst":
        import zstandard

        data = open(plain, "rb").read()
        half = len(data) // 2
        c = zstandard.ZstdCompressor()
        # Two frames, as pzstd writes: both are read.
        (tmp_path / "docs.jsonl.zst").write_bytes(c.compress(data[:half]) + c.compress(data[half:]))
        return str(tmp_path / "docs.jsonl.zst")
    text = tmp_path / "docs.txt"
    text.write_text("\n".join(d.replace("\n", " ") for d in docs) + "\n")
    return str(text)


def _train(capsys, *args: str) -> tuple[int, str, str]:
    from input_server import cli

    code = cli.main(["tokenizer", "train", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("kind", ["jsonl", "gz", "zst", "text"])
def test_a_trained_model_has_the_ids_the_server_expects_and_streams(capsys, tmp_path, docs, kind):
    corpus = _write(docs[:400], tmp_path, kind)
    model = tmp_path / "spm.model"
    code, out, err = _train(capsys, corpus, "-o", str(model), "--vocab-size", "600")
    assert code == 0, err
    assert "600 pieces (pad 0, bos 1, eos 2, unk 3)" in out and "400 documents" in out
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".model", ".vocab")) == [
        "spm.model"
    ]  # no .vocab beside it, no temporary folder left
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert (sp.vocab_size(), sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()) == (
        600,
        0,
        1,
        2,
        3,
    )
    data = write_jsonl(docs[:400], tmp_path / "serve.jsonl")
    spec = PipelineSpec(
        source={"paths": [data]},
        tokenizer={"model": str(model)},
        batch={"seq_len": 64, "size": 2},
        workers={"count": 0},
    )
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], data_roots=[str(tmp_path)])),
        InputClient(f"unix://{tmp_path}/s.sock", connect_timeout_s=30) as client,
    ):
        assert client.describe_tokenizer(spec).pad_id == 0
        batch = next(iter(client.batches(spec)))
    assert batch["inputs"].shape == (2, 64) and batch["inputs"].max() < 600


def test_bpe_and_no_pad(capsys, tmp_path, docs):
    corpus = _write(docs[:300], tmp_path, "jsonl")
    model = tmp_path / "bpe.model"
    # Whitespace collapsed as sentencepiece's default: a leading space is then the "▁" the
    # model adds itself, which is what lets the server grow a cut by the added text alone.
    code, out, err = _train(
        capsys,
        corpus,
        "-o",
        str(model),
        "--model-type",
        "bpe",
        "--vocab-size",
        "500",
        "--no-pad",
        "--collapse-whitespace",
    )
    assert code == 0, err
    assert "bpe, 500 pieces (bos 1, eos 2, unk 0)" in out
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert sp.pad_id() == -1

    from input_client.spec import TokenizerSpec
    from input_server.data.tokenizers.groups import CUT_MARGIN_GROW_ADDED
    from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer

    # The server grows a cut BPE document's tokens instead of tokenizing it again.
    tokenizer = SentencepieceTokenizer(TokenizerSpec(model=str(model)))
    assert tokenizer.cut_margin == CUT_MARGIN_GROW_ADDED


def test_the_refusals_name_a_vocabulary_that_then_trains(capsys, tmp_path, docs):
    corpus = _write(docs[:300], tmp_path, "jsonl")
    model = str(tmp_path / "m.model")
    for asked, pattern in ((100_000, r"at most (\d+)"), (20, r"at least --vocab-size (\d+)")):
        code, _, err = _train(capsys, corpus, "-o", model, "--vocab-size", str(asked))
        assert code == 2 and "Traceback" not in err
        advised = re.search(pattern, err).group(1)
        code, out, err = _train(capsys, corpus, "-o", model, "--vocab-size", advised)
        assert code == 0, err
        assert f"{int(advised):,} pieces" in out


def test_a_long_line_is_cut_for_sentencepiece_not_skipped(capsys, tmp_path):
    # One document of 40,000 characters on a single line: sentencepiece alone skips any
    # sentence over 4192 bytes, and would have nothing to train on.
    words = [f"w{i % 997}x" for i in range(8000)]
    corpus = write_jsonl([" ".join(words)], tmp_path / "long.jsonl")
    # No byte fallback: its 256 byte pieces would not fit this small vocabulary.
    code, out, err = _train(
        capsys, corpus, "-o", str(tmp_path / "m.model"), "--vocab-size", "60", "--no-byte-fallback"
    )
    assert code == 0, err
    lines = re.search(r"from 1 document \(([\d,]+) lines\)", out)
    assert lines and int(lines.group(1).replace(",", "")) >= 40, out


def test_help_says_the_defaults(capsys):
    with pytest.raises(SystemExit):
        run_main(capsys, "tokenizer", "train", "--help")
    out = capsys.readouterr().out
    assert "pad 0, bos 1, eos 2 and unk 3" in out and "default 8000" in out


# What a language model's tokenizer must give back exactly: indentation, newlines, tabs,
# repeated and trailing spaces, and characters the corpus never had (as UTF-8 bytes).
WHITESPACE_TEXTS = [
    "def f(x):\n    return x",
    "if a:\n\tb = 1\n\n\tc  =  2   ",
    "  two  leading, three   inside,\ttab\r\n",
    "caf\u00e9 \u4e2d\u6587 \U0001f600 \u00bd",
]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_by_default_a_trained_model_decodes_whitespace_and_unseen_characters_back(
    capsys, tmp_path, docs, model_type
):
    code_docs = [
        "def add(a, b):\n    return a + b",
        "for i in range(3):\n\tprint(i)  # two spaces",
    ] * 20
    corpus = _write(docs[:300] + code_docs, tmp_path, "jsonl")
    model = tmp_path / "spm.model"
    code, out, err = _train(
        capsys,
        corpus,
        "-o",
        str(model),
        "--vocab-size",
        "700",
        "--model-type",
        model_type,
        "--progress-every",
        "0.01",
    )
    assert code == 0, err
    assert "identity normalization, whitespace kept, byte fallback" in out
    # Progress on stderr while it trains (sentencepiece alone is silent).
    progress = r"tokenizer train: (reading .* so far, \d+ s|training… \d+ s \(read)"
    assert re.search(progress, err), err
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()) == (0, 1, 2, 3)
    for text in WHITESPACE_TEXTS:
        ids = sp.encode(text)
        assert sp.unk_id() not in ids, text
        assert sp.decode(ids) == text


def test_flags_give_sentencepiece_defaults_back(capsys, tmp_path, docs):
    corpus = _write(docs[:300], tmp_path, "jsonl")
    model = tmp_path / "spm.model"
    code, out, err = _train(
        capsys,
        corpus,
        "-o",
        str(model),
        "--vocab-size",
        "400",
        "--normalization",
        "nmt_nfkc",
        "--collapse-whitespace",
        "--no-byte-fallback",
    )
    assert code == 0, err
    assert "nmt_nfkc normalization, whitespace collapsed, unknown characters to unk" in out
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert sp.decode(sp.encode("def f(x):\n    return x")) == "def f(x): return x"
    assert sp.unk_id() in sp.encode("\U0001f600")
