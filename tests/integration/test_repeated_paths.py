"""One file named many times: a component naming a file more than once is refused by name
(INVALID_ARGUMENT), and a stream's shuffled document order (4 bytes a document under 2**32,
in each process that computes it) is counted against --stream-memory-mb before it is computed, so
4,096 components of one file are RESOURCE_EXHAUSTED naming the flag, not a server's memory.
Each copy of a path used to be a source of its own: 40,000 copies of a 20,000-document file
were 800 M documents, whose order took a 3 GB server down in 17 s."""

from __future__ import annotations

import json
import os
import resource
import time

import grpc
import pytest

from input_client.proto import pb
from input_server.serving.server import Server, ServerConfig
from tests.support import assert_still_flowing, flowing_stream, stream_status

DOCS = 20_000  # documents of the file named many times, as in the measured attack


def call(target: str, spec: pb.PipelineSpec, take: int = 1) -> tuple[grpc.StatusCode, str]:
    """(status, details) of a raw request; OK once `take` messages came."""
    return stream_status(target, spec, take)[:2]


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> str:
    """20,000 short documents (~600 KB)."""
    path = tmp_path_factory.mktemp("repeated") / "small.jsonl"
    with open(path, "w") as f:
        for i in range(DOCS):
            f.write(json.dumps({"text": f"document {i} of many, all work and no play"}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def tiny_file(small_file) -> str:
    """20 documents: 40,000 copies of it are 800,000 documents, a few MB even where copies
    counted (today's code must fail these tests without taking the host down; the 20,000-
    document attack runs in a memory cgroup, `test_the_attack_in_a_3_gb_server`)."""
    path = os.path.join(os.path.dirname(small_file), "tiny.jsonl")
    with open(small_file) as src, open(path, "w") as f:
        f.writelines(line for _, line in zip(range(20), src, strict=False))
    return path


@pytest.fixture
def budgeted(tmp_path):
    """A server whose streams may hold 48 MiB: a small stream's batches and one group fit,
    leaving ~38 MiB for its document order (5 M documents shuffled over epochs)."""
    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"], stream_memory_mb=48, max_workers=2, grace_s=1
    )
    with Server(config) as srv:
        yield srv.targets[0]


def test_a_path_named_many_times_is_invalid_argument_naming_field_path_and_count(
    budgeted, make_spec, small_file, tiny_file
):
    spec = make_spec(source={"paths": [tiny_file] * 40_000})
    start = time.monotonic()
    code, details = call(budgeted, spec.to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "`source.paths`" in details and "tiny.jsonl" in details, details
    assert "40,000 times" in details, details
    assert time.monotonic() - start < 20
    # The same file by a glob and by name, or in one component of a mixture, likewise.
    folder = os.path.dirname(small_file)
    spec = make_spec(source={"paths": [f"{folder}/*.jsonl", small_file]})
    code, details = call(budgeted, spec.to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "2 times" in details, details
    mixture = make_spec(source=[{"paths": [small_file]}, {"paths": [small_file, small_file]}])
    code, details = call(budgeted, mixture.to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "`source[1].paths`" in details and "2 times" in details, details
    # Named once, the file streams.
    assert call(budgeted, make_spec(source={"paths": [small_file]}).to_proto())[0] == (
        grpc.StatusCode.OK
    )


def test_a_mixture_whose_order_would_exceed_the_stream_budget_is_refused_before_it_is_built(
    budgeted, make_spec, small_file
):
    """256 components of one 20,000-document file: 5.12 M documents, 41 MiB of order over
    two epochs, past what 48 MiB leaves; refused before any permutation is computed (the
    server's peak memory does not move), while the same mixture for one epoch (one
    permutation, 20 MiB) and a few components stream."""
    many = make_spec(source=[{"paths": [small_file]}] * 256, order={"epochs": 2})
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, details = call(budgeted, many.to_proto())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "--stream-memory-mb 48" in details and "document order" in details, details
    assert "5,120,000 documents" in details and "256 components" in details, details
    assert "4 bytes each" in details, details
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 20_000  # KiB
    one_epoch = many.replace(order={"epochs": 1})
    assert call(budgeted, one_epoch.to_proto())[0] == grpc.StatusCode.OK
    few = make_spec(source=[{"paths": [small_file]}] * 4, order={"epochs": 0})
    assert call(budgeted, few.to_proto())[0] == grpc.StatusCode.OK


def test_each_worker_process_s_copy_of_the_order_is_counted(budgeted, make_spec, small_file):
    """Each worker process computes the order itself: 128 components (2.56 M documents, 20 MiB
    over two epochs) fit in-process but not in the server and two workers."""
    spec = make_spec(source=[{"paths": [small_file]}] * 128, order={"epochs": 0})
    code, details = call(budgeted, spec.replace(workers={"count": 2}).to_proto())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "each of 3 processes" in details, details
    assert call(budgeted, spec.to_proto())[0] == grpc.StatusCode.OK


def test_the_order_is_counted_at_4_bytes_a_document_under_2_32(budgeted, make_spec, small_file):
    """Each permutation is held as uint32 (the same values as the int64 one): 128 components
    (2.56 M documents) over two epochs are 20 MiB and stream in what 48 MiB leaves (~38 MiB),
    where 8 bytes a document (41 MiB) refused them. At the default 2048 MB, two fixed workers
    now take ~176 M documents a shard (~88 M over epochs), "auto" ~530 M (~265 M)."""
    spec = make_spec(source=[{"paths": [small_file]}] * 128, order={"epochs": 2})
    code, details = call(budgeted, spec.to_proto(), take=3)
    assert code == grpc.StatusCode.OK, details


def test_other_streams_flow_while_a_repeated_path_request_is_refused(
    budgeted, make_spec, tiny_file
):
    with flowing_stream(budgeted, make_spec(order={"epochs": 0}).to_proto()) as flowing:
        spec = make_spec(source={"paths": [tiny_file] * 40_000})
        assert call(budgeted, spec.to_proto())[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert_still_flowing(flowing, 0.5)


def test_an_auto_stream_takes_no_more_worker_processes_than_copies_of_its_order_fit():
    """An "auto" stream's tuning measures memory once processes run; each computes its own
    copy of the order, so the processes it may take are capped first: 45 MiB left for copies
    of a 20 MiB order is two processes, however many the server has free."""
    from input_server.batching.budget import StreamBudget
    from input_server.serving.slots import ProcessPool, ProcessReservation

    pool = ProcessPool(8)
    left_45 = StreamBudget(ram_budget_mb=45, order_bytes=20 << 20)
    mine = ProcessReservation(pool, left_45)
    assert mine.free() == 2
    assert mine.take_up_to(5) == 2 and mine.free() == 0 and pool.free() == 6
    mine.shrink_to(1)
    assert mine.free() == 1 and pool.free() == 7
    assert not mine.grow_to(3) and mine.held == 1 and pool.free() == 7  # all or none
    unshuffled = ProcessReservation(pool, StreamBudget(ram_budget_mb=45))  # an order of nothing
    assert unshuffled.free() == 7
    mine.close()
    mine.close()  # given back once
    assert pool.free() == 8
