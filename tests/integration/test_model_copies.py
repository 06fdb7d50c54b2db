"""A stream's worker processes each load their own copy of its tokenizer model: a Hugging Face
model's copies (the reference's estimate, 16 x its tokenizer.json) are counted against
--stream-memory-mb before the stream starts, and a spec whose copies would not fit is refused
with RESOURCE_EXHAUSTED naming the model, its size, the estimate and the flag (a 118 MB file
takes ~1.9 GB a process: two workers past a 3 GB server). The server's own copy is shared by
its streams: the same spec without workers is served."""

from __future__ import annotations

import os

import grpc

from input_client import PipelineSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.serving.server import Server, ServerConfig
from input_server.testing.tokenizer_models import write_large_bpe
from tests.support import stream_status


def test_worker_copies_of_a_large_model_are_refused_before_the_stream(tmp_path, docs):
    model = write_large_bpe(tmp_path / "large", 100_000)  # 2.7 MB: ~43 MB a copy
    size_mb = os.path.getsize(os.path.join(model, "tokenizer.json")) / (1 << 20)
    corpus = write_jsonl(docs[:50], tmp_path / "docs.jsonl")

    def spec(count: int) -> PipelineSpec:
        return PipelineSpec(
            source={"paths": [corpus]},
            tokenizer={"model": model, "kind": "huggingface"},
            batch={"seq_len": 128, "size": 4},
            workers={"count": count},
        )

    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"],
        data_roots=[str(tmp_path)],
        stream_memory_mb=64,
        max_workers=2,
        grace_s=1,
    )
    with Server(config) as srv:
        target = srv.targets[0]
        code, details = stream_status(target, spec(2).to_proto(), take=1)[:2]
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        for needle in ("large", f"{size_mb:,.1f} MB", "2 worker processes", "16 x the file"):
            assert needle in details, (needle, details)
        assert "--stream-memory-mb 64" in details and "`workers.count`" in details, details
        code, details = stream_status(target, spec(0).to_proto(), take=1)[:2]
        assert code == grpc.StatusCode.OK, details
