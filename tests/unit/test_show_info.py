"""`input-server info`'s table names each configured pipeline's data, a mixture's too."""

from __future__ import annotations

from input_client import PipelineSpec
from input_client.proto import pb
from input_server.tools.show_info import format_table


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
