"""input_client.maxtext without MaxText: the conventions, the config check, the shard.

tests/system/test_maxtext.py checks the same against real MaxText (its own ShiftData, its
trainer)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from input_client import PipelineSpec
from input_client.maxtext import MaxTextConfigError, check, to_maxtext
from input_client.maxtext.train import PLACEHOLDER, maxtext_argv
from input_client.wire import expand_packed


def _batch(rows: list[list[list[int]]], seq_len: int) -> dict[str, np.ndarray]:
    """A client batch from each row's documents (token lists), packed as the server packs."""
    inputs = np.zeros((len(rows), seq_len), np.int32)
    lengths, per_row = [], []
    for r, docs in enumerate(rows):
        flat = [t for d in docs for t in d]
        inputs[r, : len(flat)] = flat
        lengths += [len(d) for d in docs]
        per_row.append(len(docs))
    return expand_packed(inputs, np.array(lengths, np.int32), np.array(per_row, np.int32))


@pytest.mark.parametrize("pad_id", [0, -1])
def test_packed_rows_follow_maxtext_shift_data(pad_id):
    b = to_maxtext(_batch([[[1, 5, 6, 2], [1, 7, 2]], [[1, 8, 9, 9, 2]]], 8), pad_id, "first_fit")
    assert b["inputs"].tolist() == [[1, 5, 6, 2, 1, 7, 2, 0], [1, 8, 9, 9, 2, 0, 0, 0]]
    assert b["inputs_segmentation"].tolist() == [[1, 1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert b["inputs_position"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 0, 0, 0]]
    # Targets shift left across the row; the last column is the pad id.
    assert b["targets"].tolist() == [[5, 6, 2, 1, 7, 2, 0, pad_id], [8, 9, 9, 2, 0, 0, 0, pad_id]]
    # A document's EOS predicts the next one's BOS (weighted, as in MaxText); the token before
    # padding predicts padding (weight 0), and so does the last column.
    want_tseg = [[1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    assert b["targets_segmentation"].tolist() == want_tseg
    assert np.array_equal(b["targets_position"], b["inputs_position"])  # not shifted
    assert all(a.dtype == np.int32 for a in b.values())


def test_a_target_equal_to_the_pad_id_carries_no_weight():
    # pad id 0 with a row whose padding starts mid-row: every 0 target has weight 0.
    b = to_maxtext(_batch([[[1, 4, 2]]], 6), 0, "first_fit")
    assert b["targets"].tolist() == [[4, 2, 0, 0, 0, 0]]
    assert b["targets_segmentation"].tolist() == [[1, 1, 0, 0, 0, 0]]


def test_empty_rows_are_whole_rows_of_the_pad_id_as_batch_and_pad_makes_them():
    b = to_maxtext(_batch([[[1, 4, 2]], []], 4), -1, "first_fit")
    for key in ("inputs", "inputs_segmentation", "inputs_position", "targets", "targets_position"):
        assert b[key][1].tolist() == [-1] * 4, key
    assert b["targets_segmentation"][1].tolist() == [0] * 4
    assert b["inputs"][0].tolist() == [1, 4, 2, 0]  # a real row keeps the packer's 0 padding


def test_unpacked_rows_pad_every_input_array_with_the_pad_id():
    b = to_maxtext(_batch([[[1, 4, 2]]], 5), -1, "none")
    assert b["inputs"].tolist() == [[1, 4, 2, -1, -1]]
    assert b["inputs_segmentation"].tolist() == [[1, 1, 1, -1, -1]]
    assert b["inputs_position"].tolist() == [[0, 1, 2, -1, -1]]
    assert b["targets"].tolist() == [[4, 2, -1, -1, -1]]
    assert b["targets_segmentation"].tolist() == [[1, 1, 0, 0, 0]]
    assert all(a.dtype == np.int32 for a in b.values())


def _config(**over):
    base = dict(
        max_target_length=256,
        global_batch_size_to_load=16,
        add_bos=True,
        add_eos=True,
        vocab_size=8192,
        tokenizer_type="sentencepiece",
        tokenizer_path="",
        expansion_factor_real_data=-1,
        packing=True,
        grain_packing_type="first_fit",
        max_segments_per_seq=-1,
        use_truncation=True,
    )
    return types.SimpleNamespace(**{**base, **over})


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.model"
    path.write_bytes(b"model bytes")
    return str(path)


def _tokenizer(model_file, **over):
    import hashlib

    sha = hashlib.sha256(open(model_file, "rb").read()).hexdigest()
    return types.SimpleNamespace(**{"vocab_size": 1000, "sha256": sha, **over})


def _spec(model_file, kind="sentencepiece", **batch):
    return PipelineSpec(
        source={"paths": ["x.jsonl"]},
        tokenizer={"model": model_file, "kind": kind},
        batch={"seq_len": 256, "size": 8, **batch},
    )


def test_a_spec_that_agrees_passes(model_file):
    check.check_against_config(
        _spec(model_file),
        _config(tokenizer_path=model_file),
        _tokenizer(model_file),
        process_count=2,
        which="train",
    )


@pytest.mark.parametrize(
    ("config", "batch", "tokenizer", "names"),
    [
        (
            {"max_target_length": 512},
            {},
            {},
            ("`batch.seq_len` is 256", "`max_target_length` is 512"),
        ),
        ({}, {"size": 16}, {}, ("`batch.size` is 16", "is 8")),
        ({"add_eos": False}, {}, {}, ("`tokenizer.add_eos` is True", "`add_eos` is False")),
        ({"vocab_size": 512}, {}, {}, ("1000 pieces", "`vocab_size` is 512")),
        ({}, {}, {"sha256": "0" * 64}, ("`tokenizer.model`", "its SHA-256 differs")),
        (
            {"tokenizer_type": "tiktoken"},
            {},
            {},
            ("`tokenizer.kind` is 'sentencepiece'", "`tokenizer_type` is 'tiktoken'"),
        ),
        ({"expansion_factor_real_data": 2}, {}, {}, ("`expansion_factor_real_data` 2",)),
        ({"colocated_python_data_input": True}, {}, {}, ("`colocated_python_data_input`",)),
        ({"packing": False}, {}, {}, ("`batch.packing` is 'first_fit'", "`packing` is False")),
        ({}, {"packing": "none"}, {}, ("`batch.packing` is 'none'", "`packing` is True")),
        ({"grain_packing_type": "best_fit"}, {}, {}, ("`grain_packing_type` 'best_fit' is not",)),
        (
            {"grain_packing_type": "concat_then_split"},
            {},
            {},
            ("`batch.packing` is 'first_fit'", "`grain_packing_type` is 'concat_then_split'"),
        ),
        (  # concat_then_split's own default runs a long document on; MaxText trims it first
            {"grain_packing_type": "concat_then_split"},
            {"packing": "concat_then_split"},
            {},
            ("`batch.long_documents` is 'split'", "`use_truncation` is True", "trimmed"),
        ),
        ({"max_segments_per_seq": 8}, {}, {}, ("`max_segments_per_seq` 8 is not supported",)),
        (
            {"use_truncation": False},
            {},
            {},
            ("`batch.long_documents` is 'trim'", "`use_truncation` is False", "chunked"),
        ),
        (
            {"use_truncation": False},
            {"long_documents": "chunk", "packing": "none"},
            {},
            ("`batch.packing` is 'none'", "`packing` is True"),
        ),
        ({}, {"long_documents": "chunk"}, {}, ("`batch.long_documents` is 'chunk'", "trimmed")),
        (
            {"tokenize_train_data": False},
            {},
            {},
            ("`tokenizer.add_bos` is True", "adds no BOS/EOS", "`tokenize_train_data` is False"),
        ),
        ({"use_sft": True}, {}, {}, ("`use_sft` True is not supported",)),
        ({"elastic_enabled": True}, {}, {}, ("`elastic_enabled` True is not supported",)),
    ],
)
def test_each_mismatch_names_both_values(model_file, config, batch, tokenizer, names):
    with pytest.raises(MaxTextConfigError) as e:
        check.check_against_config(
            _spec(model_file, **batch),
            _config(tokenizer_path=model_file, **config),
            _tokenizer(model_file, **tokenizer),
            process_count=2,
            which="train",
        )
    for name in names:
        assert name in str(e.value)


@pytest.mark.parametrize(
    ("config", "batch"),
    [
        ({"use_truncation": False}, {"long_documents": "chunk"}),
        (
            {"use_truncation": False, "packing": False},
            {"long_documents": "chunk", "packing": "none"},
        ),
        (
            {"grain_packing_type": "concat_then_split"},
            {"packing": "concat_then_split", "long_documents": "trim"},
        ),
        (
            {"grain_packing_type": "concat_then_split", "use_truncation": False},
            {"packing": "concat_then_split", "long_documents": "chunk"},
        ),
        (  # MaxText's FirstFit would raise on a long pre-tokenized document; the server trims
            {"tokenize_train_data": False, "add_bos": True},
            {},
        ),
        (
            {"tokenize_train_data": False, "grain_packing_type": "concat_then_split"},
            {"packing": "concat_then_split"},
        ),
    ],
)
def test_packings_that_do_what_maxtext_does_pass(model_file, config, batch):
    spec = _spec(model_file, **batch)
    if config.get("tokenize_train_data") is False:
        spec = spec.replace(tokenizer={"add_bos": False, "add_eos": False})
    check.check_shape(spec, _config(**config), process_count=2, which="train")


def test_a_long_pre_tokenized_document_runs_on_with_maxtexts_concat_then_split(model_file):
    # No TokenizeAndTrim/Chunk for pre-tokenized data, whatever use_truncation says.
    spec = _spec(model_file, packing="concat_then_split", long_documents="trim").replace(
        tokenizer={"add_bos": False, "add_eos": False}
    )
    config = _config(tokenize_train_data=False, grain_packing_type="concat_then_split")
    with pytest.raises(MaxTextConfigError) as e:
        check.check_shape(spec, config, process_count=2, which="train")
    for name in ("`batch.long_documents` is 'trim'", "`tokenize_train_data` is False", "split"):
        assert name in str(e.value)


def test_the_tokenizer_kind_follows_tokenizer_type(model_file):
    for kind in ("huggingface", "tiktoken"):
        spec = _spec(model_file, kind=kind)
        check.check_shape(spec, _config(tokenizer_type=kind), process_count=2, which="eval")
    with pytest.raises(MaxTextConfigError, match="`tokenizer.kind` is 'huggingface'"):
        check.check_shape(
            _spec(model_file, kind="huggingface"), _config(), process_count=2, which="eval"
        )


def test_a_tokenizer_folder_is_checked_by_its_files(tmp_path):
    """A Hugging Face folder: its tokenizer.json and the config naming its tokens, hashed as the
    server's DescribeTokenizer hashes them; another config is another model."""
    from input_client import model_files

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": {}}')
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    spec = _spec(str(folder), kind="huggingface")
    config = _config(tokenizer_path=str(folder), tokenizer_type="huggingface")
    served = model_files.digest(
        {"tokenizer.json": str(folder / "tokenizer.json"),
         "tokenizer_config.json": str(folder / "tokenizer_config.json")}
    )  # fmt: skip
    check.check_tokenizer(spec, config, _tokenizer(str(folder / "tokenizer.json"), sha256=served),
                          which="train")  # fmt: skip
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<|bos|>"}')
    with pytest.raises(MaxTextConfigError, match="another model: its tokenizer.json"):
        check.check_tokenizer(
            spec, config, _tokenizer(str(folder / "tokenizer.json"), sha256=served), which="train"
        )
    (folder / "tokenizer.json").unlink()
    with pytest.raises(MaxTextConfigError, match="is a folder without a tokenizer.json here"):
        check.check_tokenizer(
            spec, config, _tokenizer(str(folder / "tokenizer_config.json")), which="train"
        )


@pytest.mark.parametrize(
    ("kind", "pad", "unk", "want"),
    [
        ("sentencepiece", -1, 0, -1),  # pad_id() is -1, not None: MaxText pads with -1
        ("sentencepiece", 3, 0, 3),
        ("tiktoken", -1, -1, -1),  # MaxText's tiktoken pad_id is -1
        ("huggingface", 5, 0, 5),
        ("huggingface", -1, 2, 2),  # pad_token_id None: unk_token_id
        ("huggingface", -1, -1, 0),  # both None: 0
    ],
)
def test_the_pad_id_is_the_one_maxtext_takes(kind, pad, unk, want):
    info = types.SimpleNamespace(pad_id=pad, unk_id=unk)
    assert check.maxtext_pad_id(info, kind) == want


def test_a_tokenizer_path_that_is_not_here_is_refused_by_name(model_file):
    with pytest.raises(MaxTextConfigError, match="'gs://bucket/tok.model' is not a file here"):
        check.check_against_config(
            _spec(model_file),
            _config(tokenizer_path="gs://bucket/tok.model"),
            _tokenizer(model_file),
            process_count=2,
            which="eval",
        )


def test_each_host_reads_its_place_among_the_loading_processes(model_file):
    spec = _spec(model_file)
    assert check.shard_for(spec, [0], 0) is spec
    s = check.shard_for(spec, [0, 2, 5], 5).shard
    assert (s.index, s.count) == (2, 3)
    own = PipelineSpec(
        source={"paths": ["x.jsonl"]},
        tokenizer={"model": model_file},
        shard={"index": 1, "count": 4},
    )
    assert check.shard_for(own, [0, 1], 0).shard == own.shard  # the spec's own shard wins


def test_the_launcher_adds_what_maxtext_needs_and_refuses_another_dataset():
    specs = {"train_spec": True, "eval_spec": True}
    assert maxtext_argv(["steps=5"], **specs) == [
        "steps=5",
        "dataset_type=grain",
        f"grain_train_files={PLACEHOLDER}",
        f"grain_eval_files={PLACEHOLDER}",
    ]
    assert maxtext_argv(["base.yml", "dataset_type=grain", "grain_train_files=x"], **specs) == [
        "base.yml",
        "dataset_type=grain",
        "grain_train_files=x",
        f"grain_eval_files={PLACEHOLDER}",
    ]
    with pytest.raises(ValueError, match="dataset_type=hf would bypass the server"):
        maxtext_argv(["dataset_type=hf"], **specs)


def test_without_spec_files_maxtexts_arguments_go_through_unchanged():
    args = ["grain_train_files=/d/*.ar", "grain_eval_files=/d/e*", "eval_interval=5"]
    assert maxtext_argv(args, train_spec=False, eval_spec=False) == [*args, "dataset_type=grain"]
    mixture = ["grain_train_mixture_config_path=mix.json"]  # enough for MaxText's config check
    assert maxtext_argv(mixture, train_spec=False, eval_spec=False)[:1] == mixture
    # A train spec file alone: the eval set still comes from MaxText's keys.
    assert maxtext_argv(args, train_spec=True, eval_spec=False) == [*args, "dataset_type=grain"]
    assert maxtext_argv(["my.yml"], train_spec=False, eval_spec=False) == [
        "my.yml",
        "dataset_type=grain",
    ]  # the file's keys are MaxText's to read


@pytest.mark.parametrize(
    ("args", "train_spec", "needle"),
    [
        (["steps=5"], False, "no training data named"),
        (["grain_train_files="], False, "no training data named"),
        (["grain_train_files=/d/*", "eval_interval=10"], False, "no eval spec was given"),
        (["eval_interval=10"], True, "eval_interval=10 asks for eval batches"),
    ],
)
def test_the_launcher_says_in_one_line_what_data_is_missing(args, train_spec, needle):
    with pytest.raises(ValueError, match=needle):
        maxtext_argv(args, train_spec=train_spec, eval_spec=False)


def _launcher(capsys, *args):
    from input_client.maxtext import train

    with pytest.raises(SystemExit) as e:
        train.main(list(args))
    return e.value.code, capsys.readouterr().err


def test_the_launcher_without_maxtext_says_so_in_one_line(capsys, model_file, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(_spec(model_file).to_toml())
    code, err = _launcher(
        capsys, "--server", "unix:///nowhere.sock", "--spec", str(spec), "steps=5"
    )
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
        "python -m input_client.maxtext.train: MaxText is not installed in this environment "
        "(pip install maxtext==0.2.5)."
    ]


def test_the_launcher_names_a_spec_mistake(capsys, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text("[source]\npaths = ['x.jsonl']\n[tokenizer]\nmodel = 'm'\n[batch]\nsize = 0\n")
    code, err = _launcher(capsys, "--server", "unix:///x.sock", "--spec", str(spec))
    assert code == 2 and "Traceback" not in err and "`batch.size`" in err


@pytest.mark.parametrize("factor", [0, -2, 1])
def test_maxtexts_off_values_of_the_expansion_factor_pass(model_file, factor):
    check.check_shape(
        _spec(model_file),
        _config(expansion_factor_real_data=factor),
        process_count=2,
        which="train",
    )


def test_a_fractional_expansion_factor_is_refused(model_file):
    with pytest.raises(MaxTextConfigError, match="`expansion_factor_real_data` 1.5"):
        check.check_shape(
            _spec(model_file),
            _config(expansion_factor_real_data=1.5),
            process_count=2,
            which="train",
        )


def test_a_checkpoint_from_another_pipeline_is_refused_by_name():
    from input_client.maxtext.source import ServerIterator

    it = ServerIterator(lambda state: pytest.fail("opened"), pad_id=-1, packing="first_fit")
    # What MaxText's own Grain iterator saves under the same run name.
    for blob in (b'{"next_index": 12, "worker_count": 1}', b"[1, 2]", b"not json"):
        with pytest.raises(MaxTextConfigError, match="not an input server's position"):
            it.set_state(blob)
    it.set_state(b"{}")  # our own "from the start"


def test_a_stream_that_cannot_open_is_recorded_for_the_launcher():
    from input_client.maxtext import source

    def refuse(state):
        raise ConnectionError("no input server reachable at 'unix:///x' after 30 s.")

    it = source.ServerIterator(refuse, pad_id=-1, packing="first_fit")
    before = len(source.failures)
    with pytest.raises(ConnectionError):
        next(it)
    assert len(source.failures) == before + 1
    assert isinstance(source.failures[-1], ConnectionError)
    del source.failures[before:]
