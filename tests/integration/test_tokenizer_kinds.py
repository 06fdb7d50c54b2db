"""Hugging Face, tiktoken and tekken tokenizers through the real server: their batches hold the
ids the tokenizer gives (BOS/EOS as asked), equal in process, through threads, worker processes
and the server (for tekken, mistral-common's own ids); DescribeTokenizer reports each kind; their
mistakes have statuses naming the key."""

from __future__ import annotations

import json
import os
import pickle

import grpc
import numpy as np
import pytest

from input_client import InputClient, PipelineSpec, StreamError
from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.trainers import (
    train_hf_tokenizer,
    write_tekken_model,
    write_tiktoken_model,
)
from tests.support import assert_same_batches, run_pipeline

SEQ, ROWS = 128, 4


@pytest.fixture(scope="module")
def models(docs, tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("kinds")
    return {
        "huggingface": train_hf_tokenizer(docs[:600], d / "hf", vocab_size=800),
        "tiktoken": write_tiktoken_model(docs[:600], d / "m.tiktoken", vocab_size=800),
        "tekken": write_tekken_model(docs[:600], d / "tekken.json", vocab_size=800),
    }


@pytest.fixture(params=["huggingface", "tiktoken", "tekken"])
def kind(request) -> str:
    return request.param


def _spec(corpus, models, kind, **batch) -> PipelineSpec:
    return PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": models[kind], "kind": kind},
        batch={"seq_len": SEQ, "size": ROWS, "packing": "none", **batch},
        order={"shuffle": False, "epochs": 1},
        workers={"count": 0},
    )


def test_rows_hold_the_tokenizers_ids(corpus, docs, models, kind):
    """With one document per row, row i is document i's ids with BOS and EOS, trimmed."""
    spec = _spec(corpus, models, kind)
    tok = load_tokenizer(spec.tokenizer)
    info = tok.info()
    rows = [r for p in run_pipeline(spec, limit=10) for r in p.batch.arrays()["inputs"]]
    for i, row in enumerate(rows[:40]):
        want = tok.encode([docs[i]]).tokens[:SEQ]
        assert want[0] == info.bos_id
        assert np.array_equal(row[: len(want)], want), i
        assert not row[len(want) :].any()
    long = next(i for i in range(40) if len(tok.encode([docs[i]]).tokens) <= SEQ)
    assert rows[long][len(tok.encode([docs[long]]).tokens) - 1] == info.eos_id


def test_threads_processes_and_the_server_give_the_same_batches(corpus, models, kind, server):
    spec = _spec(corpus, models, kind, packing="first_fit")
    want = [p.batch.arrays() for p in run_pipeline(spec, threads=1, limit=12)]
    assert_same_batches([p.batch.arrays() for p in run_pipeline(spec, threads=3, limit=12)], want)
    two = run_pipeline(spec, processes=2, limit=12)  # the tokenizer pickled into workers
    assert_same_batches([p.batch.arrays() for p in two], want)
    with InputClient(server.targets[0]) as c, c.batches(spec) as it:
        got = [b for _, b in zip(range(12), it, strict=False)]
    assert_same_batches(got, want)


def test_pickled_tokenizer_reloads_its_model(models, kind):
    tok = load_tokenizer(TokenizerSpec(model=models[kind], kind=kind))
    again = pickle.loads(pickle.dumps(tok))
    assert again._model is None
    text = ["Return the number of items in a container."]
    assert again.encode(text).tokens.tolist() == tok.encode(text).tokens.tolist()


def test_describe_reports_each_kind(models, kind, server, tmp_path):
    import hashlib
    import shutil

    from input_client import model_files

    model = models[kind]
    if kind == "huggingface":  # a copy, whose config is changed below
        model = str(shutil.copytree(model, tmp_path / "hf"))
    spec = PipelineSpec(source={"paths": ["x.jsonl"]}, tokenizer={"model": model, "kind": kind})
    with InputClient(server.targets[0]) as c:
        info = c.describe_tokenizer(spec)
        if kind == "huggingface":  # BOS, EOS, pad are the trainer's first three tokens
            assert (info.vocab_size, info.bos_id, info.eos_id, info.pad_id, info.unk_id) == (
                800,
                0,
                1,
                2,
                -1,
            )
            # The digest covers the config that names the tokens: another config, another one.
            assert info.sha256 == model_files.digest(model_files.hf_files(model))
            config = tmp_path / "hf" / "tokenizer_config.json"
            config.write_text(config.read_text().replace('"<|pad|>"', '"<|eos|>"'))
            again = c.describe_tokenizer(spec)
            assert again.sha256 != info.sha256 and again.pad_id == 1
        else:  # the file's own SHA-256
            if kind == "tiktoken":  # Llama 3's 256 specials after the ranks, no pad
                want = (1056, 800, 801, -1, -1)
            else:  # tekken: the file's specials first (`<unk>`, `<s>`, `</s>`, ..., `<pad>`)
                want = (1800, 1, 2, 5, 0)
            assert (info.vocab_size, info.bos_id, info.eos_id, info.pad_id, info.unk_id) == want
            assert info.sha256 == hashlib.sha256(open(model, "rb").read()).hexdigest()


def _refusal(server, spec) -> StreamError:
    with InputClient(server.targets[0]) as c, pytest.raises(StreamError) as e:
        with c.batches(spec) as it:
            next(it)
    return e.value


def test_mistakes_name_the_model(corpus, models, server, tmp_path_factory):
    import shutil

    d = tmp_path_factory.mktemp("bad-kinds")
    (d / "empty").mkdir()
    (d / "broken").mkdir()
    (d / "broken" / "tokenizer.json").write_text("{not json")
    padded = json.loads(open(os.path.join(models["huggingface"], "tokenizer.json")).read())
    padded["padding"] = {
        "strategy": "BatchLongest",
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 2,
        "pad_type_id": 0,
        "pad_token": "<|pad|>",
    }
    (d / "padded").mkdir()
    (d / "padded" / "tokenizer.json").write_text(json.dumps(padded))
    (d / "bad.tiktoken").write_text("IQ== 0\nnot-a-rank-line\n")
    (d / "negative.tiktoken").write_text("IQ== 0\nIg== -5\n")
    with open(d / "huge.tiktoken", "wb") as f:  # sparse: no disk is used
        f.truncate((1 << 30) + 1)
    for name, config, side in [
        ("qwen", {"tokenizer_class": "Qwen2Tokenizer"}, None),
        ("map", {"bos_token": "<|bos|>"}, {"bos_token": "<|eos|>"}),
        ("added", {"added_tokens_decoder": {"900": {"content": "<|new|>"}}}, None),
    ]:
        shutil.copytree(models["huggingface"], d / name)
        (d / name / "tokenizer_config.json").write_text(json.dumps(config))
        if side is not None:
            (d / name / "special_tokens_map.json").write_text(json.dumps(side))
    cases = [
        ("huggingface", str(d / "empty"), grpc.StatusCode.NOT_FOUND, "tokenizer.model"),
        ("huggingface", str(d / "broken"), grpc.StatusCode.INVALID_ARGUMENT, "tokenizer.json"),
        ("huggingface", str(d / "padded"), grpc.StatusCode.INVALID_ARGUMENT, "sets padding"),
        ("tiktoken", str(d / "bad.tiktoken"), grpc.StatusCode.INVALID_ARGUMENT, "line 2"),
        ("tiktoken", models["huggingface"], grpc.StatusCode.INVALID_ARGUMENT, "Hugging Face"),
        ("tiktoken", str(d / "negative.tiktoken"), grpc.StatusCode.INVALID_ARGUMENT, "rank -5"),
        ("tiktoken", str(d / "huge.tiktoken"), grpc.StatusCode.INVALID_ARGUMENT, "64 MB"),
        ("huggingface", str(d / "qwen"), grpc.StatusCode.INVALID_ARGUMENT, "Qwen2Tokenizer"),
        ("huggingface", str(d / "map"), grpc.StatusCode.INVALID_ARGUMENT, "make them agree"),
        ("huggingface", str(d / "added"), grpc.StatusCode.INVALID_ARGUMENT, "'<|new|>' as id"),
        ("huggingface", "/etc", grpc.StatusCode.PERMISSION_DENIED, "tokenizer.model"),
        # A tekken file under another kind says what it is, in one line.
        ("huggingface", models["tekken"], grpc.StatusCode.INVALID_ARGUMENT, 'kind = "tekken"'),
        ("tiktoken", models["tekken"], grpc.StatusCode.INVALID_ARGUMENT, 'kind = "tekken"'),
        ("sentencepiece", models["tekken"], grpc.StatusCode.INVALID_ARGUMENT, 'kind = "tekken"'),
        ("tekken", models["tiktoken"], grpc.StatusCode.INVALID_ARGUMENT, 'kind = "tiktoken"'),
    ]
    for kind, model, code, needle in cases:
        spec = PipelineSpec(source={"paths": [corpus]}, tokenizer={"model": model, "kind": kind})
        err = _refusal(server, spec)
        assert err.code == code and needle in err.details, (kind, model, err)


def test_an_unknown_kind_is_refused_by_name(corpus, models):
    from input_client.spec import SpecError

    with pytest.raises(SpecError, match=r"`tokenizer.kind` must be one of sentencepiece, "):
        PipelineSpec(
            source={"paths": [corpus]}, tokenizer={"model": models["tiktoken"], "kind": "bpe"}
        )


def test_a_hugging_face_model_loaded_again_is_shared_until_its_file_changes(models, tmp_path):
    """tokenizers keeps ~0.75 MB per Tokenizer that encoded once, even after it is dropped: a
    server loading the model per stream would grow per stream (measured: 300 MB per 400)."""
    import shutil

    import psutil

    folder = shutil.copytree(models["huggingface"], tmp_path / "hf")
    spec = TokenizerSpec(model=str(folder), kind="huggingface")
    texts = ["Return the number of items in a container."] * 50
    first = load_tokenizer(spec)
    first.encode(texts)
    rss = psutil.Process().memory_info().rss
    for _ in range(60):
        load_tokenizer(spec).encode(texts)
    assert psutil.Process().memory_info().rss - rss < 20 << 20  # unshared: ~45 MB
    assert load_tokenizer(spec).model() is first.model()
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().replace("<|eos|>", "<|pad|>"))
    changed = load_tokenizer(spec)
    assert changed.model() is not first.model()
    assert changed.info().eos_id == changed.info().pad_id == 2


def test_tiktoken_specials_follow_the_count_of_ranks_as_maxtext_numbers_them(tmp_path):
    """MaxText numbers the specials from len(ranks), gaps in the ranks or not."""
    import base64

    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines.append(f"{base64.b64encode(b'th').decode()} 1000")
    (tmp_path / "gap.tiktoken").write_text("\n".join(lines) + "\n")
    tok = load_tokenizer(TokenizerSpec(model=str(tmp_path / "gap.tiktoken"), kind="tiktoken"))
    info = tok.info()
    assert (info.bos_id, info.eos_id) == (257, 258)
    assert tok.encode(["the"]).tokens.tolist() == [257, 1000, ord("e"), 258]


def test_extra_special_tokens_are_tokens_in_the_text(models, tmp_path):
    """As transformers adds a config's additional special tokens: written in a document, each
    is one id, not its characters."""
    import shutil

    folder = shutil.copytree(models["huggingface"], tmp_path / "hf")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = ["<|tool|>"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(TokenizerSpec(model=str(folder), kind="huggingface", add_eos=False))
    ids = tok.encode(["a <|tool|> b"]).tokens.tolist()
    tool = tok.model().token_to_id("<|tool|>")
    assert tool == 800 and tool in ids and len(ids) <= 5


def test_the_registry_holds_every_kind_a_spec_may_name_each_behind_the_interface(
    docs, models, spm_model
):
    """Adding a kind is a module and a line in the registry: it holds exactly the kinds a spec
    may name, and each one's tokenizer, loaded from a real model, is a `Tokenizer` whose limit
    calls count the tokens `encode` gives, and whose library keys the tune cache."""
    from importlib import metadata

    from input_client import model_files
    from input_client.spec import TOKENIZER_KINDS
    from input_server.autotune.remembered import key_fields
    from input_server.data.tokenizers import KINDS, Tokenizer

    assert tuple(KINDS) == TOKENIZER_KINDS
    texts = docs[:40]
    for kind, model in {"sentencepiece": spm_model, **models}.items():
        tok = load_tokenizer(TokenizerSpec(model=model, kind=kind))
        assert type(tok) is KINDS[kind] and isinstance(tok, Tokenizer), kind
        assert tok.info().vocab_size == tok.vocab_size
        files = model_files.hf_files(model) if kind == "huggingface" else {"": model}
        assert tok.digest() == model_files.digest(files), kind
        lengths = tok.encode(texts).lengths.tolist()
        for name, call in tok.limit_calls(2).items():
            assert call(texts) == lengths, (kind, name)
        assert tok.maxtext_encoder()(texts[0]) == tok.encode(texts[:1]).tokens.tolist(), kind
        spec = PipelineSpec(source={"paths": ["x.jsonl"]}, tokenizer={"model": model, "kind": kind})
        library = metadata.version(KINDS[kind].LIBRARY)
        assert library == tok.library_version()
        # The tune cache's key: the kind's library and the fast backends that may serve it.
        fast = ", ".join(f"{n} {metadata.version(n)}" for n in KINDS[kind].BACKENDS) or "-"
        assert key_fields(spec)["tokenizer"] == f"{kind} {library}; backend auto: {fast}"
        reference = spec.replace(tokenizer={"backend": "reference"})
        assert key_fields(reference)["tokenizer"] == f"{kind} {library}; backend reference: -"


def test_mistrals_tekken_file_served_gives_mistral_commons_ids(corpus, docs, server, tmp_path):
    """Mistral NeMo's tekken file, as mistral-common ships it, named in a spec and served by
    the real server: each row is the document's ids by mistral-common's `Tekkenizer` (BOS and
    EOS its `<s>` and `</s>`), trimmed; DescribeTokenizer reports its ids."""
    import shutil

    tekken = pytest.importorskip("mistral_common.tokens.tokenizers.tekken")
    import mistral_common

    shipped = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")
    model = str(shutil.copy(shipped, tmp_path / "tekken.json"))  # inside the data roots
    ref = tekken.Tekkenizer.from_file(model)
    spec = PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": model, "kind": "tekken", "add_eos": False},
        batch={"seq_len": SEQ, "size": ROWS, "packing": "none"},
        order={"shuffle": False, "epochs": 1},
        workers={"count": 1},  # the file loaded again in a worker process
    )
    with InputClient(server.targets[0]) as c:
        info = c.describe_tokenizer(spec)
        with c.batches(spec) as it:
            rows = [r for _, b in zip(range(10), it, strict=False) for r in b["inputs"]]
    assert (info.vocab_size, info.bos_id, info.eos_id, info.pad_id, info.unk_id) == (
        ref.n_words,
        ref.bos_id,
        ref.eos_id,
        ref.pad_id,
        ref.unk_id,
    )
    for i, row in enumerate(rows):
        want = ref.encode(docs[i], True, False)[:SEQ]
        assert row[: len(want)].tolist() == want, i
        assert not row[len(want) :].any()
