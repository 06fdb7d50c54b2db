"""`input-server info`'s table names each configured pipeline's data, a mixture's too."""

from __future__ import annotations

from input_client import PipelineSpec
from input_client.proto import pb
from input_server.cli.info import format_table


def test_the_table_names_a_mixture_and_a_spec_without_a_model():
    mixture = PipelineSpec(
        source=[
            {"paths": ["a.jsonl"], "weight": 2},
            {"paths": ["b/*.parquet"], "format": "parquet"},
        ],
        tokenizer={"model": "spm.model"},
    )
    ids = PipelineSpec(
        source={"paths": ["t.parquet"], "format": "parquet", "token_field": "ids"},
        tokenizer={"vocab_size": 500, "add_bos": False, "add_eos": False},
    )
    info = pb.GetInfoResponse(
        server_version="0", pipelines={"mix": mixture.to_proto(), "ids": ids.to_proto()}
    )
    table = format_table(info, "unix:///x.sock")
    assert "mix: a mixture of 2 sources (a.jsonl, b/*.parquet)" in table
    assert "ids: t.parquet;" in table and "model none (ids below 500)" in table


def test_the_demand_column_says_what_it_means():
    info = pb.GetInfoResponse(
        server_version="0",
        streams=[
            # A tuned stream whose loop took every batch made: it wants at least that.
            pb.StreamInfo(
                stream_id=1,
                pipeline="request: docs.jsonl, spm.model",
                tuning_state="settled",
                consumed_batches_per_s=412.0,
                demand_batches_per_s=0.0,
            ),
            pb.StreamInfo(
                stream_id=2,
                pipeline="named",
                tuning_state="settled",
                consumed_batches_per_s=6.0,
                demand_batches_per_s=6.0,
            ),
            pb.StreamInfo(stream_id=3, pipeline="fixed", consumed_batches_per_s=9.0),
        ],
    )
    rows = {line.split()[0]: line for line in format_table(info, "x").splitlines()[4:]}
    assert rows["1"].endswith("≥412") and "request: docs.jsonl, spm.model" in rows["1"]
    assert rows["2"].endswith(" 6.0") and rows["3"].endswith(" -")
    assert " 0.0" not in rows["1"]
