"""The measured attacks at full size, against `input-server serve` in a 3 GB memory cgroup with
its default limits: 40,000 copies of a 20,000-document file (800 M documents), 4,096 mixture
components of it, a 300-byte Parquet file of 3.6 GB of text and a 20 KB one of 3.2 GB of ids.
Each took such a server down; each is now refused by name while another client's stream
flows, and the server is still there at the end. In the cgroup, a regression kills the
server, not the host; the bombs are built small (one dictionary entry, one row group the
footer names 100 times)."""

from __future__ import annotations

import json
import os

import grpc

from input_client.proto import pb
from input_server.testing.attacks import ids_bomb, text_bomb
from tests.support import (
    assert_still_flowing,
    bounded_server,
    flowing_stream,
    health,
    needs_memory_cgroup,
    stream_status,
)


def call(target: str, spec: pb.PipelineSpec, take: int = 1) -> tuple[grpc.StatusCode, str]:
    """(status, details) of a raw request; OK once `take` messages came."""
    return stream_status(target, spec, take, timeout=120)[:2]


def test_the_attacks_in_a_3_gb_server_are_refused_while_another_stream_flows(tmp_path, make_spec):
    small = tmp_path / "small.jsonl"
    with open(small, "w") as f:
        for i in range(20_000):
            f.write(json.dumps({"text": f"document {i} of many, all work and no play"}) + "\n")
    wide = tmp_path / "wide.jsonl"  # 40,000 documents
    wide.write_text(small.read_text() * 2)
    text = text_bomb(tmp_path / "text.parquet", rows=3456)  # 3.6 GB decoded
    ids = ids_bomb(tmp_path / "ids.parquet", row_groups=100, rows=4000)  # 3.2 GB decoded
    attacks = [
        # (spec, status, words the refusal must say)
        (
            make_spec(source={"paths": [str(small)] * 40_000}),
            grpc.StatusCode.INVALID_ARGUMENT,
            ["`source.paths`", "small.jsonl", "40,000 times"],
        ),
        (
            make_spec(
                # Of `wide`: at 4 bytes a document, 4,096 of `small` (82 M) fit 2 workers.
                source=[{"paths": [str(wide)]}] * 4096,
                workers={"count": 2},
                order={"epochs": 0},
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ["document order", "--stream-memory-mb 2048", "4,096 components"],
        ),
        (
            make_spec(source={"paths": [text], "format": "parquet"}),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ["text.parquet row group 0", "--max-decompressed-mb 1024"],
        ),
        (
            make_spec(source={"paths": [ids], "format": "parquet", "token_field": "ids"}),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ["ids.parquet row group", "--max-decompressed-mb 1024"],
        ),
    ]
    needs_memory_cgroup("the attacks at full size need one")
    with (
        bounded_server(os.getcwd(), gb=3) as server,
        flowing_stream(
            server.target, make_spec(order={"epochs": 0}).to_proto(), 300, started=1
        ) as flowing,
    ):
        target, p = server.target, server.process
        for spec, status, words in attacks:
            code, details = call(target, spec.to_proto())
            assert p.poll() is None, f"the server died ({p.returncode}) on {words[0]}"
            assert code == status, (words, code, details)
            assert all(w in details for w in words), (words, details)
        # The 4,096 components in one process fit its budget (625 MiB of order):
        # it streams.
        mixture = make_spec(source=[{"paths": [str(small)]}] * 4096, order={"epochs": 0})
        assert call(target, mixture.to_proto(), take=2) == (grpc.StatusCode.OK, "")
        assert_still_flowing(flowing)
        assert p.poll() is None and health(target) == 1
        # For the record (`pytest -s`): the resident peak, and the cgroup's (page cache in).
        print(
            f"server's peak memory: {server.peak.bytes >> 20} MiB resident, "
            f"{(server.cgroup_peak() or 0) >> 20} MiB in its cgroup"
        )
