"""The pipeline spec: TOML and keyword forms, validation messages (autotune keys too), the proto
round trip."""

from __future__ import annotations

import math
import os
import textwrap

import pytest

from input_client import PipelineSpec, SpecError
from input_client.spec import validate

ISSUE_EXAMPLE = """
[source]
paths = ["data/*.jsonl"]   # files or globs
format = "jsonl"
text_field = "text"
record_format = "json"
[tokenizer]
model = "spm.model"
add_bos = true
add_eos = true
[batch]
seq_len = 1024
size = 16
packing = "first_fit"
[order]
seed = 0
shuffle = true
epochs = 1
[shard]
index = 0
count = 1
[workers]
count = "auto"
ram_budget_mb = 1024
"""


def test_toml_reads_every_table_and_resolves_relative_paths(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(ISSUE_EXAMPLE)
    spec = PipelineSpec.from_toml(path)
    assert spec.source.paths == (os.path.join(tmp_path, "data/*.jsonl"),)
    assert spec.tokenizer.model == os.path.join(tmp_path, "spm.model")
    assert (spec.batch.seq_len, spec.batch.size, spec.batch.packing) == (1024, 16, "first_fit")
    assert (spec.order.seed, spec.order.shuffle, spec.order.epochs) == (0, True, 1)
    assert (spec.shard.index, spec.shard.count) == (0, 1)
    assert (spec.workers.count, spec.workers.ram_budget_mb) == ("auto", 1024)
    validate(spec)


def test_to_toml_reads_back_equal(tmp_path):
    spec = PipelineSpec(
        source={
            "paths": ['/data/été "quoted"/*.parquet', "/b\\c.jsonl", "/d/😀\x7f\t.jsonl"],
            "format": "parquet",
            "text_field": "body",
        },
        tokenizer={"model": "/m/spm.model", "add_bos": False},
        batch={"seq_len": 512, "size": 3, "packing": "none"},
        order={"seed": 7, "shuffle": False, "epochs": 0},
        shard={"index": 1, "count": 4},
        workers={"count": "auto", "target_batches_per_s": 12.5, "tune_seconds": 3.0},
    )
    path = tmp_path / "spec.toml"
    path.write_text(spec.to_toml())
    assert PipelineSpec.from_toml(path) == spec


def test_keyword_construction_equals_toml(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(ISSUE_EXAMPLE)
    from_file = PipelineSpec.from_toml(path)
    by_keyword = PipelineSpec(
        source={"paths": [str(tmp_path / "data/*.jsonl")]},
        tokenizer={"model": str(tmp_path / "spm.model")},
    )
    assert by_keyword == from_file


def test_proto_round_trip_keeps_every_key():
    spec = PipelineSpec(
        source={"paths": ["a.parquet", "b/*.parquet"], "format": "parquet", "text_field": "body"},
        tokenizer={"model": "m.model", "add_bos": False},
        batch={"seq_len": 64, "size": 3, "packing": "none"},
        order={"seed": 7, "shuffle": False, "epochs": 0},
        shard={"index": 1, "count": 4},
        workers={"count": 3, "ram_budget_mb": 9},
    )
    assert PipelineSpec.from_proto(spec.to_proto()) == spec


def test_data_fingerprint_ignores_workers_only():
    base = PipelineSpec(source={"paths": ["a"]}, tokenizer={"model": "m"})
    assert base.data_fingerprint() == base.replace(workers={"count": 5}).data_fingerprint()
    assert base.data_fingerprint() != base.replace(order={"seed": 1}).data_fingerprint()


@pytest.mark.parametrize(
    "tables, key, value",
    [
        ({"source": {"paths": []}}, "source.paths", "()"),
        ({"source": {"format": "csv"}}, "source.format", "'csv'"),
        ({"source": {"record_format": "xml"}}, "source.record_format", "'xml'"),
        ({"source": {"text_field": ""}}, "source.text_field", "''"),
        ({"tokenizer": {"model": ""}}, "tokenizer.model", "''"),
        ({"tokenizer": {"add_bos": "yes"}}, "tokenizer.add_bos", "'yes'"),
        ({"batch": {"seq_len": 0}}, "batch.seq_len", "0"),
        ({"batch": {"size": -2}}, "batch.size", "-2"),
        ({"batch": {"size": 2.5}}, "batch.size", "2.5"),
        ({"batch": {"packing": "best_fit"}}, "batch.packing", "'best_fit'"),
        ({"order": {"epochs": -1}}, "order.epochs", "-1"),
        ({"order": {"seed": -5}}, "order.seed", "-5"),
        ({"order": {"shuffle": 1}}, "order.shuffle", "1"),
        ({"shard": {"index": 2, "count": 2}}, "shard.index", "2"),
        ({"shard": {"count": 0}}, "shard.count", "0"),
        ({"workers": {"count": "many"}}, "workers.count", "'many'"),
        ({"workers": {"count": -1}}, "workers.count", "-1"),
        ({"workers": {"ram_budget_mb": 0}}, "workers.ram_budget_mb", "0"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_invalid_value_names_key_and_value(tables, key, value):
    spec = PipelineSpec(source={"paths": ["a.jsonl"]}, tokenizer={"model": "m.model"})
    with pytest.raises(SpecError) as e:
        validate(spec.replace(**tables))
    assert e.value.key == key
    assert f"`{key}`" in str(e.value) and value in str(e.value)


def test_unknown_key_and_table_are_refused(tmp_path):
    with pytest.raises(SpecError, match=r"`batch.sizee`.*known: long_documents, packing, seq_len"):
        PipelineSpec.from_dict(
            {"source": {"paths": ["a"]}, "tokenizer": {"model": "m"}, "batch": {"sizee": 3}}
        )
    with pytest.raises(SpecError, match=r"`btach` is not a spec table"):
        PipelineSpec.from_dict(
            {"source": {"paths": ["a"]}, "tokenizer": {"model": "m"}, "btach": {}}
        )
    with pytest.raises(SpecError, match=r"`tokenizer` is a required table"):
        PipelineSpec.from_dict({"source": {"paths": ["a"]}})
    bad = tmp_path / "bad.toml"
    bad.write_text("[source\npaths = 1")
    with pytest.raises(SpecError, match="not valid TOML"):
        PipelineSpec.from_toml(bad)


def test_missing_required_key_is_named():
    with pytest.raises(SpecError, match=r"`source.paths` is required"):
        PipelineSpec.from_dict({"source": {"format": "jsonl"}, "tokenizer": {"model": "m"}})


def test_pipelines_file_names_specs_and_errors(tmp_path):
    from input_server.cli.serve import load_pipelines

    path = tmp_path / "pipelines.toml"
    path.write_text(
        textwrap.dedent("""
        [wiki.source]
        paths = ["wiki.jsonl"]
        [wiki.tokenizer]
        model = "spm.model"
        [code.source]
        paths = ["/abs/code.jsonl"]
        [code.tokenizer]
        model = "spm.model"
        [code.batch]
        size = 2
    """)
    )
    pipelines = load_pipelines(str(path))
    assert sorted(pipelines) == ["code", "wiki"]
    assert pipelines["wiki"].source.paths == (str(tmp_path / "wiki.jsonl"),)
    assert pipelines["code"].source.paths == ("/abs/code.jsonl",)
    assert pipelines["code"].batch.size == 2
    path.write_text("[wiki.source]\npaths = ['a']\nbogus = 1\n[wiki.tokenizer]\nmodel = 'm'\n")
    with pytest.raises(SpecError, match=r"`wiki.source.bogus`"):
        load_pipelines(str(path))


@pytest.mark.parametrize(
    "keys, key",
    [
        ({"max_workers": -1}, "workers.max_workers"),
        ({"target_batches_per_s": -1.0}, "workers.target_batches_per_s"),
        ({"target_batches_per_s": math.nan}, "workers.target_batches_per_s"),
        ({"tune_seconds": 0}, "workers.tune_seconds"),
        ({"tune_seconds": 10_000}, "workers.tune_seconds"),
        ({"count": 2, "threads": -1}, "workers.threads"),
        ({"count": 2, "threads": 1000}, "workers.threads"),
        ({"count": 2, "threads": 1.5}, "workers.threads"),
        ({"count": "auto", "threads": 2}, "workers.threads"),
    ],
)
def test_bad_workers_keys_are_refused_by_name(keys, key):
    spec = PipelineSpec(source={"paths": ["a.jsonl"]}, tokenizer={"model": "m"})
    with pytest.raises(SpecError) as e:
        validate(spec.replace(workers=keys))
    assert e.value.key == key


def test_workers_keys_survive_toml_and_proto(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(
        '[source]\npaths = ["a.jsonl"]\n[tokenizer]\nmodel = "m"\n[workers]\n'
        'count = "auto"\nmax_workers = 6\ntarget_batches_per_s = 2.5\n'
        "tune_seconds = 8\n"
    )
    spec = PipelineSpec.from_toml(path)
    validate(spec)
    w = spec.workers
    assert (w.max_workers, w.target_batches_per_s, w.tune_seconds) == (6, 2.5, 8)
    assert PipelineSpec.from_proto(spec.to_proto()) == spec
    assert spec.data_fingerprint() == spec.replace(workers={"max_workers": 1}).data_fingerprint()


def test_workers_threads_fix_the_tuners_whole_choice(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(
        '[source]\npaths = ["a.jsonl"]\n[tokenizer]\nmodel = "m"\n[workers]\n'
        "count = 2\nthreads = 3\n"
    )
    spec = PipelineSpec.from_toml(path)
    assert (spec.workers.count, spec.workers.threads) == (2, 3)
    assert PipelineSpec.from_proto(spec.to_proto()) == spec
    assert spec.data_fingerprint() == spec.replace(workers={"threads": 0}).data_fingerprint()


def test_long_documents_at_the_packings_default_keeps_the_fingerprint():
    base = PipelineSpec(source={"paths": ["a.jsonl"]}, tokenizer={"model": "m.model"})
    trim = base.replace(batch={"long_documents": "trim"})
    assert trim.data_fingerprint() == base.data_fingerprint()
    assert base.replace(batch={"long_documents": "chunk"}).data_fingerprint() != (
        base.data_fingerprint()
    )
    cts = base.replace(batch={"packing": "concat_then_split"})
    assert cts.replace(batch={"long_documents": "split"}).data_fingerprint() == (
        cts.data_fingerprint()
    )
    assert cts.replace(batch={"long_documents": "trim"}).data_fingerprint() != (
        cts.data_fingerprint()
    )


def test_the_tekken_kind_survives_toml_and_proto_and_an_unknown_kind_names_it(tmp_path):
    """`kind = "tekken"` (Mistral's tekken.json) is a kind a spec may name, on both sides."""
    path = tmp_path / "spec.toml"
    path.write_text(
        '[source]\npaths = ["d.jsonl"]\n[tokenizer]\nmodel = "tekken.json"\nkind = "tekken"\n'
    )
    spec = PipelineSpec.from_toml(str(path))
    assert spec.tokenizer.kind == "tekken" and spec.tokenizer.to_dict()["kind"] == "tekken"
    assert PipelineSpec.from_proto(spec.to_proto()) == spec
    with pytest.raises(SpecError, match="sentencepiece, huggingface, tiktoken, tekken, got 'tek'"):
        spec.replace(tokenizer={"kind": "tek"})
