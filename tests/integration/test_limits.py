"""Bounded requests: memory a stream may hold, document size, files per request, worker
processes across streams, request size. Each refusal names its numbers and the key or flag
to change, and the server goes on serving others."""

from __future__ import annotations

import json
import os
import time

import grpc
import pytest

from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION
from input_server.batching.pipeline import Pipeline
from input_server.data.roots import DataAccess
from input_server.serving.server import Server, ServerConfig
from tests.support import stream_status as call


@pytest.fixture
def limited(tmp_path):
    """A server with small limits, data root the working directory (the tests' data)."""
    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"],
        stream_memory_mb=512,
        max_document_mb=1,
        max_files=20,
        max_workers=2,
        grace_s=1,
    )
    with Server(config) as srv:
        yield srv.targets[0]


def test_a_spec_that_cannot_fit_its_memory_budget_is_refused_and_others_flow(limited, make_spec):
    huge = make_spec().to_proto()
    huge.batch.size, huge.batch.seq_len = 2048, 1 << 20
    start = time.monotonic()
    code, details, _ = call(limited, huge)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--stream-memory-mb 512" in details and "batch.size" in details
    assert "2048" in details and "1048576" in details
    assert time.monotonic() - start < 5
    code, _, n = call(limited, make_spec().to_proto())
    assert code == grpc.StatusCode.OK and n > 1


def write_docs(path, docs) -> str:
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return str(path)


def test_a_document_over_the_limit_is_invalid_argument_naming_file_line_and_limit(
    limited, make_spec, docs, tmp_path
):
    big = "word " * 600_000  # 3 MB, over the server's 1 MB
    path = write_docs(tmp_path / "big.jsonl", [docs[0], docs[1], big, docs[2]])
    for packing in ("first_fit", "concat_then_split"):
        spec = make_spec(source={"paths": [os.path.relpath(path)]}, batch={"packing": packing})
        code, details, _ = call(limited, spec.to_proto())
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert "big.jsonl line 3" in details and "--max-document-mb 1" in details
    code, _, n = call(limited, make_spec().to_proto())
    assert code == grpc.StatusCode.OK and n > 1


class _CountingProcessor:
    """Sentencepiece (outside this project) with a count of the characters it encodes."""

    def __init__(self, sp):
        self.sp, self.chars = sp, 0

    def encode(self, texts, **kwargs):
        self.chars += sum(map(len, texts))
        return self.sp.encode(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.sp, name)


def test_a_long_document_is_not_tokenized_whole_to_learn_from_the_sample(make_spec, docs, tmp_path):
    """The sample that learns characters per token takes a prefix of each document: the
    tokenizer's sample learning once tokenized the first 64 documents whole (a 200 MB one
    took the server down)."""
    path = write_docs(tmp_path / "long.jsonl", ["word " * 2_000_000, *docs[:100]])  # 10 MB
    spec = make_spec(source={"paths": [path]})
    pipeline = Pipeline.__new__(Pipeline)
    from input_server.data.tokenizers.sentencepiece import SentencepieceTokenizer

    counting = {}
    original = SentencepieceTokenizer.model

    def model(self):
        sp = original(self)
        counting.setdefault(id(self), _CountingProcessor(sp))
        return counting[id(self)]

    SentencepieceTokenizer.model = model
    try:
        pipeline.__init__(spec)
    finally:
        SentencepieceTokenizer.model = original
    encoded = sum(c.chars for c in counting.values())
    assert 0 < encoded < 2_000_000, encoded


def test_more_files_than_the_limit_is_invalid_argument(limited, make_spec, docs, tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(25):
        write_docs(folder / f"{i:02}.jsonl", docs[i * 4 : (i + 1) * 4])
    rel = os.path.relpath(folder)
    code, details, _ = call(limited, make_spec(source={"paths": [f"{rel}/*.jsonl"]}).to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than 20 files" in details and "--max-files" in details
    code, details, _ = call(limited, make_spec(source={"paths": [f"{rel}/0*.jsonl"]}).to_proto())
    assert code == grpc.StatusCode.OK, details


def test_one_file_in_a_thousand_components_is_opened_once(make_spec, corpus):
    """10,000 copies of one path took 26 s, 3.5-5.5 GB and 10,010 open files. One component
    may name a file once (`test_repeated_paths.py`); many components may each name it."""
    spec = make_spec(source=[{"paths": [corpus]}] * 1_000)
    fds = len(os.listdir("/proc/self/fd"))
    start = time.monotonic()
    pipeline = Pipeline(spec, DataAccess(roots=[os.path.dirname(corpus)], max_files=100_000))
    assert time.monotonic() - start < 10
    assert len({id(r) for r in pipeline.source._readers}) == 1
    assert len(os.listdir("/proc/self/fd")) - fds < 10


def test_worker_processes_are_capped_across_streams(limited, make_spec):
    code, details, _ = call(limited, make_spec(workers={"count": 3}).to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "workers.count" in details and "--max-workers 2" in details
    endless = make_spec(workers={"count": 2}, order={"epochs": 0})
    with grpc.insecure_channel(limited) as channel:
        first = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter(
                [
                    pb.StreamBatchesRequest(
                        spec=endless.to_proto(), protocol_version=PROTOCOL_VERSION
                    )
                ]
            )
        )
        next(first)  # both processes held
        code, details, _ = call(limited, make_spec(workers={"count": 1}).to_proto())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "0 of the server's --max-workers 2" in details
        # "auto" is clipped to what is free (none: in process), never refused.
        auto = make_spec(workers={"count": "auto", "tune_seconds": 3})
        code, details, n = call(limited, auto.to_proto(), take=2)
        assert code == grpc.StatusCode.OK, details
        first.cancel()
    # Freed with the stream: a fixed count fits again.
    deadline = time.monotonic() + 10
    while True:
        code, details, _ = call(limited, make_spec(workers={"count": 2}).to_proto(), take=1)
        if code == grpc.StatusCode.OK or time.monotonic() > deadline:
            break
    assert code == grpc.StatusCode.OK, details


def test_a_request_over_the_size_limit_is_refused_before_it_is_read(limited, make_spec):
    spec = make_spec().to_proto()
    spec.source.paths[:] = ["x" * 1000] * 5000  # 5 MB of paths
    code, details, _ = call(limited, spec)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    code, _, n = call(limited, make_spec().to_proto())
    assert code == grpc.StatusCode.OK and n > 1


def test_a_named_pipeline_over_the_worker_cap_stops_the_start(tmp_path, make_spec):
    """Else every stream of it would wait for processes it can never get."""
    with pytest.raises(Exception) as e:
        Server(
            ServerConfig(
                listen=[f"unix://{tmp_path}/s.sock"],
                max_workers=2,
                pipelines={"big": make_spec(workers={"count": 3})},
            )
        )
    assert "'big'" in str(e.value) and "--max-workers 2" in str(e.value)
    assert not os.path.exists(tmp_path / "s.sock")
