"""input_client.maxtext.derive on MaxText's real config (0.2.5, its own Python 3.12 venv built by
scripts/tools/maxtext_venv.sh): `maxtext.configs.pyconfig.initialize` with base.yml and real command
lines, the derived specs as the adapter's factories would stream them, the adapter's own checks
passing on them, a mixture's weights equal to the proportions of MaxText's own `get_datasets`
mixture on the same files, and refusals in one line naming the key and its value.

One venv process (MaxText's imports take several seconds). Skip locally with `-m "not maxtext"`.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from input_client import PipelineSpec

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]


# For each case: its name, "train" or "eval", and MaxText's command line. Each config is
# MaxText's own (base.yml + the line), then derived, then checked by the adapter's own checks;
# a MaxTextConfigError is reported as its message. Mixture cases also run MaxText's own
# get_datasets on the files and report the proportions its Grain mix draws by.
DERIVE = textwrap.dedent("""
    import json, sys
    from maxtext.configs import pyconfig
    from maxtext.input_pipeline import grain_data_processing
    from input_client.maxtext import MaxTextConfigError, check, derive

    cases, common = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    out = {}
    for name, which, argv in cases:
        config = pyconfig.initialize(["", *common, *argv])
        try:
            spec = (derive.train_spec if which == "train" else derive.eval_spec)(
                config, process_count=1)
            check.check_shape(spec, config, process_count=1, which=which)
            out[name] = {"spec": spec.to_dict()}
        except MaxTextConfigError as e:
            out[name] = {"error": str(e)}
            continue
        if spec.is_mixture and which == "train":
            files = "" if config.grain_train_mixture_config_path else config.grain_train_files
            mixed = grain_data_processing.get_datasets(
                files, "arrayrecord", shuffle=False, shuffle_seed=0, shuffle_buffer_size=1,
                num_epoch=1, dataloading_host_index=0, dataloading_host_count=1,
                grain_worker_count=0, grain_num_threads=1, grain_prefetch_buffer_size=1,
                grain_data_source_max_workers=1,
                mixture_config_path=config.grain_train_mixture_config_path or None)
            out[name]["grain_proportions"] = list(mixed._proportions)
    print(json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def derived(maxtext_python, tmp_path_factory):
    """Every case's result, from one venv process whose working folder is `d` (so relative
    patterns resolve there, as MaxText resolves them)."""
    from array_record.python import array_record_module

    d = tmp_path_factory.mktemp("derive")
    (d / "data").mkdir()
    for name in ("web-0", "web-1", "code-0"):  # real files for MaxText's own mixture
        writer = array_record_module.ArrayRecordWriter(
            str(d / "data" / f"{name}.array_record"), "group_size:1"
        )
        for _ in range(4):
            writer.write(b"")
        writer.close()
    model = d / "spm.model"
    model.write_bytes(b"not read: derivation names the file, the server reads it")
    (d / "hf").mkdir()
    (d / "llama3.tiktoken").write_text("")
    (d / "mix.json").write_text(
        json.dumps(
            {
                "code": {"path": "data/code-*.array_record", "weight": 13},
                "web": {"path": "data/web-*.array_record", "weight": 7},
            }
        )
    )
    common = [
        "run_name=derive",
        f"base_output_directory={d / 'out'}",
        "dataset_type=grain",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
        "log_config=false",
        "enable_tensorboard=false",
    ]
    glob = "grain_train_files=data/web-*.array_record"
    tok = f"tokenizer_path={model}"
    cases = [
        ("defaults", "train", [glob, tok]),
        (
            "shape",
            "train",
            [
                glob,
                tok,
                "max_target_length=256",
                "per_device_batch_size=4",
                "gradient_accumulation_steps=2",
            ],
        ),  # fmt: skip
        (
            "order",
            "train",
            [
                glob,
                tok,
                "enable_data_shuffling=false",
                "data_shuffle_seed=9",
                "num_epoch=3",
                "add_bos=false",
            ],
        ),  # fmt: skip
        ("mixture", "train", ["grain_train_files=data/web-*,0.35;data/code-*,0.65", tok]),
        ("mixture_config", "train", [f"grain_train_mixture_config_path={d / 'mix.json'}", tok]),
        (
            "pre_tokenized",
            "train",
            [glob, tok, "tokenize_train_data=false", "train_data_columns=[ids]"],
        ),  # fmt: skip
        ("unpacked", "train", [glob, tok, "packing=false"]),
        ("concat_then_split", "train", [glob, tok, "grain_packing_type=concat_then_split"]),
        ("chunk", "train", [glob, tok, "use_truncation=false"]),
        ("parquet", "train", ["grain_file_type=parquet", "grain_train_files=data/*.parquet", tok]),
        ("tfds_layout", "train", ["grain_file_type=tfrecord", f"dataset_path={d}/tfds", tok]),
        (
            "huggingface",
            "train",
            [glob, f"tokenizer_path={d / 'hf'}", "tokenizer_type=huggingface"],
        ),  # fmt: skip
        (
            "tiktoken",
            "train",
            [glob, f"tokenizer_path={d / 'llama3.tiktoken'}", "tokenizer_type=tiktoken"],
        ),  # fmt: skip
        (
            "eval",
            "eval",
            [
                glob,
                tok,
                "grain_eval_files=data/code-*.array_record",
                "eval_interval=10",
                "eval_data_columns=[body]",
                "eval_per_device_batch_size=2",
                "num_epoch=4",
            ],
        ),  # fmt: skip
        ("refused_hf_path", "train", ["grain_file_type=parquet", "hf_path=allenai/c4", tok]),
        ("refused_mmap", "train", ["grain_file_type=mmap", "grain_train_files=data/x", tok]),
        ("refused_epochs", "train", [glob, tok, "num_epoch=0"]),
        ("refused_gcs", "train", ["grain_train_files=gs://bucket/train-*", tok]),
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DECOUPLE_GCLOUD": "TRUE"}
    env.pop("XLA_FLAGS", None)  # one CPU device: per_device_batch_size is the batch
    out = subprocess.run(
        [maxtext_python, "-c", DERIVE, json.dumps(cases), json.dumps(common)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=d,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return d.resolve(), str(model), json.loads(out.stdout.strip().splitlines()[-1])


def _spec(result) -> PipelineSpec:
    assert "spec" in result, result
    return PipelineSpec.from_dict(result["spec"])


def _want(d, model, **tables) -> PipelineSpec:
    """The spec base.yml's defaults give, with `tables` changed."""
    base = PipelineSpec(
        source={
            "paths": [str(d / "data" / "web-*.array_record")],
            "format": "arrayrecord",
            "record_format": "tf_example",
        },
        tokenizer={"model": model},
        batch={"seq_len": 2048, "size": 12},  # base.yml: max_target_length, 12 per device
    )
    return base.replace(**tables)


def test_base_ymls_defaults_give_the_arrayrecord_pipeline_maxtext_runs(derived):
    d, model, got = derived
    assert _spec(got["defaults"]) == _want(d, model)
    assert _spec(got["shape"]).batch == _want(d, model, batch={"seq_len": 256, "size": 8}).batch
    assert _spec(got["order"]) == _want(
        d,
        model,
        order={"shuffle": False, "seed": 9, "epochs": 3},
        tokenizer={"add_bos": False},
    )


def test_mixtures_draw_by_maxtexts_own_proportions(derived):
    d, model, got = derived
    mixture = _spec(got["mixture"])
    assert [(s.name, s.paths) for s in mixture.source] == [
        ("0", (str(d / "data" / "web-*"),)),
        ("1", (str(d / "data" / "code-*"),)),
    ]
    weights = [s.weight for s in mixture.source]
    # Grain truncates 0.65 / 0.35 * 100 = 185.7 (and MaxText rounds w / sum to 4 places first).
    assert weights == got["mixture"]["grain_proportions"] == [100, 185]
    named = _spec(got["mixture_config"])
    assert [(s.name, s.paths) for s in named.source] == [
        ("code", (str(d / "data" / "code-*.array_record"),)),
        ("web", (str(d / "data" / "web-*.array_record"),)),
    ]
    weights = [s.weight for s in named.source]
    assert weights == got["mixture_config"]["grain_proportions"] == [185, 100]


def test_pre_tokenized_packing_and_truncation_keys(derived):
    d, model, got = derived
    ids = _spec(got["pre_tokenized"])
    assert ids == _want(
        d,
        model,
        source={"token_field": "ids"},
        tokenizer={"add_bos": False, "add_eos": False},
    )
    assert _spec(got["unpacked"]).batch.packing == "none"
    cts = _spec(got["concat_then_split"]).batch
    assert (cts.packing, cts.long_documents_policy) == ("concat_then_split", "trim")
    assert _spec(got["chunk"]).batch.long_documents == "chunk"


def test_file_types_and_tokenizer_kinds(derived):
    d, model, got = derived
    parquet = _spec(got["parquet"]).source
    assert (parquet.format, parquet.paths) == ("parquet", (str(d / "data" / "*.parquet"),))
    tfds = _spec(got["tfds_layout"]).source
    assert (tfds.format, tfds.paths) == ("tfrecord", (f"{d}/tfds/c4/en/3.1.0/*-train.tfrecord-*",))
    hf = _spec(got["huggingface"]).tokenizer
    assert (hf.kind, hf.model) == ("huggingface", str(d / "hf"))
    assert _spec(got["tiktoken"]).tokenizer.kind == "tiktoken"


def test_the_eval_spec_is_one_pass_of_the_eval_files_at_the_loaded_batch(derived):
    d, model, got = derived
    assert _spec(got["eval"]) == _want(
        d,
        model,
        source={"paths": [str(d / "data" / "code-*.array_record")], "text_field": "body"},
        order={"shuffle": False, "epochs": 1},
    )  # batch.size 12: MaxText's Grain eval batches with the train's local size


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        ("refused_hf_path", ("MaxText's `hf_path` 'allenai/c4'", "hub")),
        ("refused_mmap", ("MaxText's `grain_file_type` 'mmap' is not supported",)),
        ("refused_epochs", ("MaxText's `num_epoch` 0",)),
        ("refused_gcs", ("MaxText's `grain_train_files` 'gs://bucket/train-*'", "data roots")),
    ],
)
def test_what_the_server_cannot_honour_is_refused_in_one_line(derived, case, needles):
    _, _, got = derived
    message = got[case].get("error", "")
    assert message and "\n" not in message, got[case]
    for needle in needles:
        assert needle in message, (needle, message)
