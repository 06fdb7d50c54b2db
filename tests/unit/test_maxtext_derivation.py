"""input_client.maxtext.derive without MaxText: each MaxText data key's rule and each refusal,
on config objects holding base.yml's defaults. tests/system/test_maxtext_derive.py derives
from MaxText's real config (its pyconfig, base.yml included)."""

from __future__ import annotations

import json
import os
import types

import pytest

from input_client import PipelineSpec
from input_client.maxtext import MaxTextConfigError, check, derive

# MaxText 0.2.5's configs/base.yml values of the keys the derivation reads (and the batch sizes
# pyconfig computes from per_device_batch_size=12.0 on one device). `is_offline_distillation`
# is not in base.yml (the distillation trainer sets it); `getattr` defaults it, as MaxText does.
BASE_YML = dict(
    dataset_type="grain",  # base.yml says synthetic; the launcher sets grain
    grain_train_files="",
    grain_eval_files="",
    grain_train_mixture_config_path="",
    grain_file_type="arrayrecord",
    grain_packing_type="first_fit",
    grain_worker_count=1,
    grain_use_elastic_iterator=False,
    train_data_columns=["text"],
    eval_data_columns=["text"],
    tokenize_train_data=True,
    tokenize_eval_data=True,
    tokenizer_type="sentencepiece",
    tokenizer_path="",
    add_bos=True,
    add_eos=True,
    use_truncation=True,
    max_target_length=1024,
    global_batch_size_to_load=12,
    global_batch_size_to_load_eval=12,
    packing=True,
    max_segments_per_seq=-1,
    enable_data_shuffling=True,
    data_shuffle_seed=0,
    num_epoch=1,
    eval_interval=-1,
    expansion_factor_real_data=-1.0,
    colocated_python_data_input=False,
    elastic_enabled=False,
    use_sft=False,
    use_dpo=False,
    use_multimodal=False,
    hf_path="",
    dataset_path="",
    dataset_name="c4/en:3.1.0",
    eval_dataset_name="c4/en:3.1.0",
    train_split="train",
    eval_split="validation",
    vocab_size=32000,
)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "spm.model"
    path.write_bytes(b"a model")
    return str(path)


def _config(**over):
    return types.SimpleNamespace(**{**BASE_YML, **over})


def _train(model, process_count=1, **over):
    over.setdefault("grain_train_files", "/data/train*.array_record")
    over.setdefault("tokenizer_path", model)
    return derive.train_spec(_config(**over), process_count=process_count)


def _refused(model, *needles, which="train", **over):
    over.setdefault("grain_train_files", "/data/train*.array_record")
    over.setdefault("grain_eval_files", "/data/eval*.array_record")
    over.setdefault("tokenizer_path", model)
    derived = derive.train_spec if which == "train" else derive.eval_spec
    with pytest.raises(MaxTextConfigError) as e:
        derived(_config(**over), process_count=1)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def test_base_yml_defaults_with_a_glob_give_maxtexts_arrayrecord_pipeline(model):
    spec = _train(model, process_count=2, global_batch_size_to_load=16)
    assert spec.to_dict() == {
        "source": {
            "paths": ["/data/train*.array_record"],
            "format": "arrayrecord",
            "text_field": "text",
            "record_format": "tf_example",
        },
        "tokenizer": {"model": model, "add_bos": True, "add_eos": True},
        "batch": {"seq_len": 1024, "size": 8, "packing": "first_fit"},
        "order": {"seed": 0, "shuffle": True, "epochs": 1},
        "shard": {"index": 0, "count": 1},
        "workers": {
            "count": "auto",
            "ram_budget_mb": 1024,
            "max_workers": 0,
            "target_batches_per_s": 0.0,
            "tune_seconds": 20.0,
            "threads": 0,
        },
    }
    # What MaxText's own checks make of the spec it was derived from: nothing to name.
    check.check_shape(spec, _config(tokenizer_path=model, global_batch_size_to_load=16),
                      process_count=2, which="train")  # fmt: skip


def test_a_relative_pattern_resolves_as_maxtexts_find_data_files(model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spec = _train(model, grain_train_files="shards/*.array_record")
    assert spec.source.paths == (str(tmp_path.resolve() / "shards" / "*.array_record"),)
    assert _train(model, grain_train_files="~/d/*.ar").source.paths == (
        str(tmp_path / "home" / "d" / "*.ar"),
    )
    rel = _train(model.replace(str(tmp_path) + os.sep, ""))
    assert rel.tokenizer.model == model  # tokenizer_path absolute too


def test_the_semicolon_mixture_gets_grains_own_proportions_and_positional_names(model):
    spec = _train(model, grain_train_files="/d/web*,0.3;/d/code*,0.7")
    assert [(s.name, s.paths, s.weight) for s in spec.source] == [
        ("0", ("/d/web*",), 100),
        ("1", ("/d/code*",), 233),  # int(0.7 * 100 / 0.3): Grain truncates
    ]
    assert all(s.format == "arrayrecord" for s in spec.source)
    # MaxText rounds w / sum to 4 places first: 1 : 2 is 0.3333 : 0.6667, then 100 : 200.
    thirds = _train(model, grain_train_files="/a*,1;/b*,2")
    assert [s.weight for s in thirds.source] == [100, 200]
    assert spec.all_named  # a resume survives new weights, as Grain's list mixture does


def test_the_mixture_config_names_components_by_its_keys(model, tmp_path):
    path = tmp_path / "mix.json"
    path.write_text(
        json.dumps(
            {"web": {"path": "/d/web*", "weight": 3}, "code": {"path": "/d/c*", "weight": 1}}
        )
    )
    spec = _train(model, grain_train_mixture_config_path=str(path), grain_train_files="/ignored*")
    assert [(s.name, s.paths, s.weight) for s in spec.source] == [
        ("web", ("/d/web*",), 300),
        ("code", ("/d/c*",), 100),
    ]


@pytest.mark.parametrize(
    ("file_type", "want"),
    [
        ("arrayrecord", {"format": "arrayrecord", "record_format": "tf_example"}),
        ("parquet", {"format": "parquet"}),
        ("tfrecord", {"format": "tfrecord"}),
    ],
)
def test_each_grain_file_type_is_its_source_format(model, file_type, want):
    source = _train(model, grain_file_type=file_type, grain_train_files="/d/t-*").source.to_dict()
    assert {k: source[k] for k in want} == want
    if file_type != "arrayrecord":
        assert source["record_format"] == "json"  # the default, not read for these formats


def test_pre_tokenized_data_reads_ids_and_adds_no_specials(model):
    spec = _train(model, tokenize_train_data=False, train_data_columns=["ids"])
    assert spec.source.token_field == "ids"
    assert (spec.tokenizer.add_bos, spec.tokenizer.add_eos) == (False, False)
    assert spec.tokenizer.model == model  # MaxText still takes its pad id from the tokenizer
    # first_fit: MaxText would fail (docs/maxtext.md)
    assert spec.batch.long_documents_policy == "trim"
    split = _train(
        model,
        tokenize_train_data=False,
        grain_packing_type="concat_then_split",
        use_truncation=False,
    )
    assert split.batch.long_documents_policy == "split"  # ConcatThenSplit runs it on
    unpacked = _train(model, tokenize_train_data=False, packing=False)
    assert unpacked.batch.long_documents_policy == "trim"  # PadOrTrimToMaxLength


@pytest.mark.parametrize(
    ("over", "packing", "long_documents"),
    [
        ({}, "first_fit", ""),
        ({"packing": False}, "none", ""),
        ({"grain_packing_type": "concat_then_split"}, "concat_then_split", "trim"),
        ({"use_truncation": False}, "first_fit", "chunk"),
        ({"use_truncation": False, "packing": False}, "none", "chunk"),
        (
            {"use_truncation": False, "grain_packing_type": "concat_then_split"},
            "concat_then_split",
            "chunk",
        ),
    ],
)
def test_packing_and_truncation(model, over, packing, long_documents):
    spec = _train(model, **over)
    # The policy is written only where it is not the packing's default: a derived spec is the
    # spec one writes by hand.
    assert (spec.batch.packing, spec.batch.long_documents) == (packing, long_documents)
    check.check_shape(spec, _config(tokenizer_path=model, **over), process_count=1, which="train")


def test_order_and_tokenizer_keys(model, tmp_path):
    spec = _train(
        model, enable_data_shuffling=False, data_shuffle_seed=7, num_epoch=3, add_eos=False
    )
    assert (spec.order.shuffle, spec.order.seed, spec.order.epochs) == (False, 7, 3)
    assert (spec.tokenizer.add_bos, spec.tokenizer.add_eos) == (True, False)
    (tmp_path / "hf").mkdir()
    hf = _train(str(tmp_path / "hf"), tokenizer_type="huggingface")
    assert (hf.tokenizer.kind, hf.tokenizer.model) == ("huggingface", str(tmp_path / "hf"))
    tt = _train(model, tokenizer_type=types.SimpleNamespace(value="tiktoken"))  # an enum
    assert tt.tokenizer.kind == "tiktoken"


def test_the_eval_spec_is_one_unshuffled_pass_of_the_eval_files(model):
    config = _config(
        tokenizer_path=model,
        grain_eval_files="/d/eval*,1;/d/more*,1",
        eval_data_columns=["body"],
        data_shuffle_seed=4,
        num_epoch=5,
        tokenize_train_data=False,  # the train set's switch, not the eval set's
    )
    spec = derive.eval_spec(config, process_count=3)
    assert [(s.name, s.paths, s.weight, s.text_field) for s in spec.source] == [
        ("0", ("/d/eval*",), 100, "body"),
        ("1", ("/d/more*",), 100, "body"),
    ]
    assert (spec.order.shuffle, spec.order.epochs, spec.order.seed) == (False, 1, 4)
    assert spec.batch.size == 4  # MaxText's Grain eval batches with the train's local size
    assert spec.tokenizer.add_bos


def test_tfrecord_files_from_maxtexts_tfds_layout(model):
    config = _config(tokenizer_path=model, grain_file_type="tfrecord", dataset_path="/tfds/")
    train = derive.train_spec(config, process_count=1)
    assert train.source.paths == ("/tfds/c4/en/3.1.0/*-train.tfrecord-*",)
    evals = derive.eval_spec(config, process_count=1)
    assert evals.source.paths == ("/tfds/c4/en/3.1.0/*-validation.tfrecord-*",)


@pytest.mark.parametrize(
    ("over", "needles"),
    [
        ({"grain_train_files": ""}, ("`grain_train_files` is empty", "--spec")),
        ({"grain_train_files": "gs://b/x*"}, ("`grain_train_files` 'gs://b/x*'", "data roots")),
        ({"grain_train_files": "/a*,1;hf://d/b*,1"}, ("`grain_train_files` 'hf://d/b*'",)),
        ({"grain_file_type": "mmap"}, ("`grain_file_type` 'mmap'",)),
        ({"grain_file_type": "mmap_npy"}, ("`grain_file_type` 'mmap_npy'",)),
        (
            {"grain_file_type": "parquet", "grain_train_files": "", "hf_path": "org/set"},
            ("`hf_path` 'org/set'", "hub"),
        ),
        (
            {"grain_file_type": "tfrecord", "grain_train_files": "", "dataset_path": "gs://b"},
            ("`dataset_path` 'gs://b' is not supported", "data roots"),
        ),
        (
            {"grain_file_type": "parquet", "grain_train_files": "/a*,1;/b*,1"},
            ("`grain_train_files` '/a*,1;/b*,1'", "arrayrecord"),
        ),
        ({"grain_train_files": "/a*,1;/b*"}, ("`grain_train_files` '/a*,1;/b*'", "PATTERN,WEIGHT")),
        ({"grain_train_files": "/a*,x;/b*,1"}, ("`grain_train_files` '/a*,x;/b*,1'", "numbers")),
        ({"grain_train_files": "/a*,0;/b*,1"}, ("`grain_train_files` '/a*,0;/b*,1'", "above 0")),
        ({"grain_train_files": "/a*,1;/b*,100000"}, ("above 0",)),  # 1/100001 rounds to 0
        ({"train_data_columns": ["a", "b"]}, ("`train_data_columns` ['a', 'b']",)),
        ({"num_epoch": 0}, ("`num_epoch` 0", "order.epochs = 0")),
        ({"num_epoch": -1}, ("`num_epoch` -1",)),
        ({"tokenizer_path": ""}, ("`tokenizer_path` is empty",)),
        ({"tokenizer_path": "gs://b/t.model"}, ("`tokenizer_path` 'gs://b/t.model'",)),
        (
            {"tokenizer_path": "meta-llama/Llama-3.1-8B", "tokenizer_type": "huggingface"},
            ("`tokenizer_path` 'meta-llama/Llama-3.1-8B'", "hub name"),
        ),
        ({"tokenizer_type": "byte"}, ("`tokenizer_type` 'byte'",)),
        # The server's tekken kind is no MaxText tokenizer_type.
        ({"tokenizer_type": "tekken"}, ("`tokenizer_type` 'tekken'", "huggingface, tiktoken")),
        ({"grain_packing_type": "best_fit"}, ("`grain_packing_type` 'best_fit'",)),
        ({"max_segments_per_seq": 32}, ("`max_segments_per_seq` 32",)),
        ({"use_sft": True}, ("`use_sft` True",)),
        ({"use_dpo": True}, ("`use_dpo` True",)),
        ({"use_multimodal": True}, ("`use_multimodal` True",)),
        ({"is_offline_distillation": True}, ("`is_offline_distillation` True",)),
        ({"colocated_python_data_input": True}, ("`colocated_python_data_input` True",)),
        ({"grain_use_elastic_iterator": True}, ("`grain_use_elastic_iterator` True",)),
        ({"elastic_enabled": True}, ("`elastic_enabled` True",)),
        ({"expansion_factor_real_data": 0.5}, ("`expansion_factor_real_data` 0.5",)),
        ({"max_target_length": 1}, ("`max_target_length`", "`batch.seq_len`", "got 1")),
        ({"global_batch_size_to_load": 0}, ("`global_batch_size_to_load`", "got 0")),
        ({"data_shuffle_seed": -3}, ("`data_shuffle_seed`", "`order.seed`", "got -3")),
    ],
)
def test_what_the_server_cannot_honour_is_refused_by_key_and_value(model, over, needles):
    _refused(model, *needles, **over)


@pytest.mark.parametrize(
    ("over", "needles"),
    [
        ({"grain_train_files": "/d/*.jsonl"}, ("'/d/*.jsonl' names JSON lines", "--spec")),
        ({"grain_train_files": "/d/a.jsonl.zst"}, ("JSON lines", "Parquet")),
        ({"grain_train_files": "/d/*.txt"}, ("plain-text", "--spec")),
        ({"grain_train_files": "/d/a*.array_record,1;/d/b*.jsonl,1"}, ("'/d/b*.jsonl'",)),
        ({"grain_train_files": "/d/*.parquet"}, ("Parquet files", "grain_file_type=parquet")),
        (
            {"grain_train_files": "/d/*.array_record", "grain_file_type": "parquet"},
            ("ArrayRecord files but grain_file_type is 'parquet'", "=arrayrecord"),
        ),
        (
            {"grain_train_files": "/d/x-train.tfrecord-*", "grain_file_type": "parquet"},
            ("TFRecord files", "grain_file_type=tfrecord"),
        ),
    ],
)
def test_files_of_a_format_grain_file_type_cannot_read_are_refused(model, over, needles):
    # Read as the wrong format they would fail only at the first batch (DATA_LOSS).
    _refused(model, "`grain_train_files`", *needles, **over)
    # Names that say no format, or the one grain_file_type reads, pass.
    for files, file_type in [
        ("/d/train-*", "arrayrecord"),
        ("/d/*.array_record-*", "arrayrecord"),
        ("/d/*.parquet", "parquet"),
        ("/d/*.tfrecord*", "tfrecord"),
    ]:
        _train(model, grain_train_files=files, grain_file_type=file_type)


def test_a_mixture_config_that_cannot_be_read_is_refused_naming_it(model, tmp_path):
    key = "`grain_train_mixture_config_path`"
    missing = str(tmp_path / "none.json")
    _refused(model, f"{key} {missing!r}", "No such file", grain_train_mixture_config_path=missing)
    bad = tmp_path / "bad.json"
    bad.write_text('{"web": {"path": "/d/w*"}}')
    _refused(model, key, "'web'", '"weight"', grain_train_mixture_config_path=str(bad))
    bad.write_text("[1]")
    _refused(model, key, "NAME", grain_train_mixture_config_path=str(bad))
    bad.write_text('{"web": {"path": "/d/w*", "weight": 1}}')
    _refused(
        model,
        key,
        "arrayrecord",
        grain_train_mixture_config_path=str(bad),
        grain_file_type="parquet",
    )


def test_an_eval_without_files_is_refused_naming_the_key(model):
    _refused(model, "`grain_eval_files` is empty", "--eval-spec", which="eval", grain_eval_files="")
    _refused(model, "`grain_eval_files` 'gs://b/e*'", which="eval", grain_eval_files="gs://b/e*")


def test_grain_proportions_are_groups_of_the_smallest_as_100():
    assert derive.grain_proportions([0.25, 0.75]) == [100, 300]
    assert derive.grain_proportions([0.3, 0.7]) == [100, 233]


def test_a_derived_spec_round_trips_through_toml(model, tmp_path):
    spec = _train(model, grain_train_files="/a*,0.4;/b*,0.6", use_truncation=False)
    (tmp_path / "s.toml").write_text(spec.to_toml())
    assert PipelineSpec.from_toml(tmp_path / "s.toml") == spec


def test_double_star_is_one_folder_level_as_maxtexts_glob_has_it(model, tmp_path):
    """MaxText globs without recursive=True: `**` is one level there, any depth in the server's
    walk; the derived pattern says `*`, and both then read the same files."""
    import glob

    for rel in ("a.ar", "sub/b.ar", "sub/deep/c.ar"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    pattern = f"{tmp_path}/**/*.ar"
    spec = _train(model, grain_train_files=pattern)
    assert spec.source.paths == (f"{tmp_path}/*/*.ar",)
    assert sorted(glob.glob(spec.source.paths[0])) == sorted(glob.glob(pattern))
    assert glob.glob(pattern) == [f"{tmp_path}/sub/b.ar"]
