"""Pre-tokenized sources: a corpus tokenized, its ids written in every format the server reads,
and streamed, gives the batches its text gives; TFRecord files read without TensorFlow."""

from __future__ import annotations

import json
import os

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm

from input_client import PipelineSpec, StreamError
from input_server.data.tf_example import make_example
from input_server.data.tfrecord import write_tfrecord
from tests.support import assert_same_batches, run_pipeline, write_arrayrecord


@pytest.fixture(scope="module")
def texts(some_docs) -> list[str]:
    return some_docs[:200]


@pytest.fixture(scope="module")
def files(texts, spm_model, tmp_path_factory) -> dict[str, dict]:
    """The texts as jsonl, and their ids (no specials) as each format's source table."""
    d = tmp_path_factory.mktemp("ids")
    ids = spm.SentencePieceProcessor(model_file=spm_model).encode(texts)
    text = os.path.join(d, "text.jsonl")
    with open(text, "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    jsonl = os.path.join(d, "ids.jsonl")
    with open(jsonl, "w") as f:
        f.writelines(json.dumps({"ids": x, "text": "decoy"}) + "\n" for x in ids)
    parquet = os.path.join(d, "ids.parquet")
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}), parquet)
    parquet64 = os.path.join(d, "ids64.parquet")
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int64()))}), parquet64)
    records = write_arrayrecord(
        os.path.join(d, "ids.array_record"), [make_example(ids=x) for x in ids]
    )
    json_records = write_arrayrecord(
        os.path.join(d, "ids_json.array_record"), [json.dumps({"ids": x}).encode() for x in ids]
    )
    tfrecord = os.path.join(d, "ids.tfrecord")
    write_tfrecord(tfrecord, (make_example(ids=x) for x in ids))
    text_tfrecord = os.path.join(d, "text.tfrecord")
    write_tfrecord(text_tfrecord, (make_example(text=t) for t in texts))
    return {
        "text": {"paths": [text]},
        "jsonl": {"paths": [jsonl], "token_field": "ids"},
        "parquet": {"paths": [parquet], "format": "parquet", "token_field": "ids"},
        "parquet-int64": {"paths": [parquet64], "format": "parquet", "token_field": "ids"},
        "arrayrecord": {
            "paths": [records],
            "format": "arrayrecord",
            "record_format": "tf_example",
            "token_field": "ids",
        },
        "arrayrecord-json": {
            "paths": [json_records],
            "format": "arrayrecord",
            "token_field": "ids",
        },
        "tfrecord": {"paths": [tfrecord], "format": "tfrecord", "token_field": "ids"},
        "tfrecord-text": {"paths": [text_tfrecord], "format": "tfrecord"},
    }


def _spec(source, spm_model, packing="first_fit") -> PipelineSpec:
    return PipelineSpec(
        source=source,
        tokenizer={"model": spm_model},
        batch={"seq_len": 96, "size": 4, "packing": packing},
        order={"seed": 5},
        workers={"count": 0},
    )


def _arrays(produced) -> list[dict]:
    return [p.batch.arrays() for p in produced]


KINDS = ["jsonl", "parquet", "parquet-int64", "arrayrecord", "arrayrecord-json", "tfrecord"]


@pytest.mark.parametrize("packing", ["first_fit", "concat_then_split"])
@pytest.mark.parametrize("kind", [*KINDS, "tfrecord-text"])
def test_ids_stream_the_batches_their_text_does(files, spm_model, kind, packing):
    want = _arrays(run_pipeline(_spec(files["text"], spm_model, packing)))
    got = _arrays(run_pipeline(_spec(files[kind], spm_model, packing)))
    assert len(want) > 10
    assert_same_batches(got, want)


def test_a_mixture_of_text_and_ids_is_the_mixture_of_their_texts(files, spm_model, texts, tmp_path):
    half = os.path.join(tmp_path, "half.jsonl")
    with open(half, "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts[:100])

    def mixture(second):
        return _spec(
            [{"paths": [half], "weight": 1, "name": "a"}, {**second, "weight": 2, "name": "b"}],
            spm_model,
        )

    want = _arrays(run_pipeline(mixture(files["text"])))
    got = _arrays(run_pipeline(mixture(files["parquet"]), threads=3))
    assert_same_batches(got, want)


def test_ids_from_the_server_equal_the_pipelines(files, spm_model, client):
    spec = _spec(files["tfrecord"], spm_model)
    want = run_pipeline(spec)
    assert_same_batches(list(client.batches(spec)), [w.arrays for w in want])


def test_a_corrupt_tfrecord_record_is_data_loss_naming_file_and_record(
    files, spm_model, client, tmp_path
):
    src = files["tfrecord"]["paths"][0]
    data = bytearray(open(src, "rb").read())
    at = 0
    for _ in range(7):  # past records 0-6: record 7's header (8 + 4 bytes), then its data
        at += 16 + int.from_bytes(data[at : at + 8], "little")
    data[at + 12 + 3] ^= 0xFF  # a byte of record 7's data: its CRC fails
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    spec = _spec({**files["tfrecord"], "paths": [str(bad)]}, spm_model)
    with pytest.raises(StreamError) as e:
        list(client.batches(spec))
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert "bad.tfrecord record 7" in str(e.value)


def test_ids_outside_the_models_vocabulary_name_file_record_and_id(spm_model, tmp_path, client):
    path = tmp_path / "big.parquet"
    ids = [[5, 6, 7]] * 30 + [[5, 1000, 7]]  # the fixture's model has 1,000 pieces
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))}), path)
    spec = _spec({"paths": [str(path)], "format": "parquet", "token_field": "ids"}, spm_model)
    spec = spec.replace(order={"shuffle": False})
    with pytest.raises(StreamError) as e:
        list(client.batches(spec))
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert "big.parquet row 30" in str(e.value) and "1000" in str(e.value)
