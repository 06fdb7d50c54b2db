"""Every bad input a stream can meet gets its documented status from the real server, naming the
field, value or path; nothing reaches a client as UNKNOWN."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from input_client import InputClient, StreamError
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION
from input_server.errors import (
    CorruptFileError,
    DataNotFoundError,
    InvalidSpecError,
    OverBudgetError,
    RecordError,
    UnreadableError,
    WorkerDiedError,
    status_of,
)
from input_server.serving.server import Server, ServerConfig
from tests.support import dial


def raw_stream(target: str, spec_proto: pb.PipelineSpec, state: bytes = b"") -> list[pb.Batch]:
    """Streams a request as any client could send it (no client-side validation)."""
    with dial(target) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        request = pb.StreamBatchesRequest(
            spec=spec_proto, resume_state=state, protocol_version=PROTOCOL_VERSION
        )
        return list(stub.StreamBatches(iter([request]), timeout=60))


def status(target: str, spec_proto: pb.PipelineSpec, state: bytes = b"") -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        raw_stream(target, spec_proto, state)
    assert e.value.code() != grpc.StatusCode.UNKNOWN, e.value.details()
    assert "Traceback" not in e.value.details()
    return e.value


@pytest.mark.parametrize(
    "count",
    ["²", "٣", "9" * 5000, "-1", "1e3"],
    ids=["superscript", "arabic-indic", "5000-digits", "negative", "float"],
)
def test_a_worker_count_that_is_not_a_count_is_invalid_argument(target, make_spec, count):
    msg = make_spec().to_proto()
    msg.workers.count = count
    e = status(target, msg)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "workers.count" in e.details() and len(e.details()) < 400


@pytest.mark.parametrize(
    "state",
    [
        b'{"version":1,"fingerprint":"FP","seq":Infinity,"doc":0,"offset":0}',
        b'{"version":1,"fingerprint":"FP","seq":NaN,"doc":0,"offset":0}',
        b'{"version":1,"fingerprint":"FP","seq":1e400,"doc":0,"offset":0}',
        b'{"version":1,"fingerprint":"FP","seq":1180591620717411303424,"doc":0,"offset":0}',
        b'{"version":1,"fingerprint":"FP","seq":"3","doc":0,"offset":0}',
        b'{"version":1,"fingerprint":"FP","seq":true,"doc":0,"offset":0}',
        b'{"version":1,"fingerprint":"FP","seq":0,"doc":1.5,"offset":0}',
        b"[" * 100_000,
        b"\xff\xfe",
        b"[1, 2]",
    ],
    ids=["infinity", "nan", "overflow", "2^70", "string", "bool", "float", "deep", "bytes", "list"],
)
def test_a_resume_state_this_server_did_not_write_is_invalid_argument(target, make_spec, state):
    spec = make_spec()
    state = state.replace(b"FP", spec.data_fingerprint().encode())
    e = status(target, spec.to_proto(), state)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "resume_state" in e.details()


def test_a_tuning_budget_shorter_than_a_window_still_streams_and_settles(tmp_path, make_spec):
    from tests.support import consume_until

    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "tune_seconds": 0.5})
    with (
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
        InputClient(srv.targets[0], connect_timeout_s=10) as c,
        c.batches(spec) as it,
    ):
        assert next(it)["inputs"].shape == (4, 128)
        stream = consume_until(it, c, lambda s: s.tuning_state == "settled", pace=100, timeout=20)
        assert next(it)["inputs"].shape == (4, 128)
    # The bound ends the search at the window after it expired: two candidates at most.
    measured = [m for m in stream.worker_tuning.measurements if m.batches_per_s > 0]
    assert 1 <= len(measured) <= 2, stream.worker_tuning
    assert stream.worker_tuning.tune_seconds < 0.5 + 3


def _flipped_parquet(tmp_path, docs, compression: str) -> str:
    path = str(tmp_path / f"{compression}.parquet")
    pq.write_table(pa.table({"text": docs}), path, row_group_size=200, compression=compression)
    data = bytearray(open(path, "rb").read())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.mark.parametrize("compression", ["snappy", "zstd", "none"])
def test_a_bit_flipped_parquet_file_is_data_loss_naming_it(
    target, make_spec, docs, tmp_path, compression
):
    path = _flipped_parquet(tmp_path, docs[:1000], compression)
    spec = make_spec(source={"paths": [path], "format": "parquet"})
    e = status(target, spec.to_proto())
    assert e.code() == grpc.StatusCode.DATA_LOSS, e.details()
    assert path in e.details()


needs_setpriv = pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None,
    reason="as root, an unreadable file needs setpriv to drop the capability to read anyway",
)


@needs_setpriv
@pytest.mark.parametrize("which", ["source", "model"])
def test_a_file_the_server_may_not_read_is_permission_denied_naming_it(
    tmp_path, corpus, spm_model, make_spec, which
):
    secret = tmp_path / ("secret.jsonl" if which == "source" else "secret.model")
    shutil.copy(corpus if which == "source" else spm_model, secret)
    secret.chmod(0)
    spec = make_spec(
        **(
            {"source": {"paths": [str(secret)]}}
            if which == "source"
            else {"tokenizer": {"model": str(secret)}}
        )
    )
    sock = tmp_path / "s.sock"
    # Root reads any file; drop the capabilities that let it, as an ordinary user lacks them.
    prefix = (
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
        if os.geteuid() == 0
        else []
    )
    server = subprocess.Popen(
        [*prefix, sys.executable, "-m", "input_server.cli", "serve", "--listen", f"unix://{sock}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.1)
        e = status(f"unix://{sock}", spec.to_proto())
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()
        assert str(secret) in e.details()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_client_refuses_a_state_that_is_not_a_get_state_result(client, make_spec):
    for bad in ({"seq": float("inf")}, {"seq": "3"}, {"doc": 1}, [0]):
        with pytest.raises(ValueError, match="get_state"):
            client.batches(make_spec(), state=bad)


def test_the_status_table_maps_each_error_class_and_the_unexpected_to_internal():
    table = {
        InvalidSpecError("x"): grpc.StatusCode.INVALID_ARGUMENT,
        DataNotFoundError("x"): grpc.StatusCode.NOT_FOUND,
        UnreadableError("x"): grpc.StatusCode.PERMISSION_DENIED,
        RecordError("x"): grpc.StatusCode.DATA_LOSS,
        CorruptFileError("x"): grpc.StatusCode.DATA_LOSS,
        WorkerDiedError("x"): grpc.StatusCode.INTERNAL,
        OverBudgetError("x"): grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    for error, code in table.items():
        assert status_of(error) == (code, "x")
    assert status_of(ZeroDivisionError("boom")) == (
        grpc.StatusCode.INTERNAL,
        "ZeroDivisionError: boom",
    )


def test_a_stream_error_reaching_the_client_names_its_status(client, make_spec, tmp_path):
    spec = make_spec(source={"paths": [str(tmp_path / "missing.jsonl")]})
    with pytest.raises(StreamError) as e:
        list(client.batches(spec))
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "missing.jsonl" in e.value.details
    assert "Traceback" not in e.value.details


def test_a_foreign_resume_state_is_refused_before_any_tuning(tmp_path, make_spec):
    # "auto" tunes for up to tune_seconds; a request refused for its state must not wait.
    spec = make_spec(workers={"count": "auto", "tune_seconds": 20})
    foreign = json.dumps(
        {"version": 1, "fingerprint": "0" * 16, "seq": 3, "doc": 9, "offset": 0}
    ).encode()
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv:
        start = time.monotonic()
        e = status(srv.targets[0], spec.to_proto(), foreign)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "other data" in e.details()
        assert time.monotonic() - start < 5


def test_a_huge_name_or_path_is_echoed_cut_and_keeps_its_status(target, make_spec):
    # Echoed whole, a 1 MB name overflowed gRPC's trailing metadata: the client got
    # RESOURCE_EXHAUSTED instead of NOT_FOUND.
    with dial(target) as channel:
        stub = pb_grpc.InputServiceStub(channel)
        request = pb.StreamBatchesRequest(
            pipeline_name="x" * (1 << 20), protocol_version=PROTOCOL_VERSION
        )
        with pytest.raises(grpc.RpcError) as e:
            list(stub.StreamBatches(iter([request]), timeout=60))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "pipeline_name" in e.value.details() and len(e.value.details()) < 400
    msg = make_spec().to_proto()
    for path, code in [
        ("nonexistent/" + "y" * 100_000 + ".jsonl", "NOT_FOUND"),  # in the root
        ("/nonexistent/" + "y" * 100_000 + ".jsonl", "PERMISSION_DENIED"),
    ]:
        msg.source.paths[:] = [path]
        e = status(target, msg)
        assert e.code() == getattr(grpc.StatusCode, code) and len(e.details()) < 400
        assert e.details().startswith("`source.paths`")
        assert f"({len(path)} characters)" in e.details()


def test_a_panic_escaping_a_method_gets_a_status_not_unknown():
    """A Rust library's panic (pyo3's PanicException) is a BaseException: a guard that caught
    only Exception let it escape, and gRPC answered UNKNOWN. The context is a stand-in for
    gRPC's (outside the project): it records the status the guard gives."""
    from input_server.serving.guards import guard_stream, guard_unary

    class Panic(BaseException):  # what pyo3_runtime.PanicException derives from
        pass

    class Context:
        def is_active(self):
            return False  # nothing logged for a caller who left

        def abort(self, code, message):
            self.status = (code, message)
            raise grpc.RpcError()

    class Servicer:
        @guard_unary(pb.Tokenizer)
        def unary(self, request, context):
            raise Panic("Onig: Regex search error: retry-limit-in-match over")

        @guard_stream
        def stream(self, requests, context):
            yield from ()
            raise Panic("Onig: Regex search error: retry-limit-in-match over")

    want = (grpc.StatusCode.INTERNAL, "Panic: Onig: Regex search error: retry-limit-in-match over")
    context = Context()
    with pytest.raises(grpc.RpcError):
        Servicer().unary(pb.Tokenizer(), context)
    assert context.status == want
    context = Context()
    with pytest.raises(grpc.RpcError):
        list(Servicer().stream(iter(()), context))
    assert context.status == want


def test_a_state_past_its_document_is_refused_and_logged_in_one_line(tmp_path, make_spec, caplog):
    # The state parses (its numbers fit; this packing stops inside documents), so the stream
    # fails at its first batch: the server logged a 20-line traceback for each such request
    # (the fuzzer's seed 9001: 32 of them).
    spec = make_spec(batch={"seq_len": 128, "size": 4, "packing": "concat_then_split"})
    state = json.dumps(
        {"version": 1, "fingerprint": spec.data_fingerprint(), "seq": 0, "doc": 0, "offset": 10**9}
    ).encode()
    with (
        caplog.at_level(logging.WARNING),
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv,
    ):
        e = status(srv.targets[0], spec.to_proto(), state)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert failed, (e.details(), [r.getMessage() for r in caplog.records])
    assert all(not r.exc_info and "\n" not in r.getMessage() for r in failed), [
        (r.getMessage(), r.exc_info) for r in failed
    ]
