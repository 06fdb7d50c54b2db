"""Raw callers that break the contract on purpose: each gets its own status, and nobody else's
stream, `info` or health check notices.

Each case here was a one-request denial of service found by trying the server as an attacker
would (issue 18): a credit report out of range, calls that never send their first request, a
request of many globs, a resume position past its document.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from input_client import InputClient
from input_client.proto import pb
from input_client.wire import PROTOCOL_VERSION
from input_server.serving.server import Server, ServerConfig
from tests.support import TOKENS, dial, health

METHOD = "/input_server.v1.InputService/StreamBatches"
# Starved, health and info took their whole 5 s deadline; served, milliseconds (0.015 s beside
# 24 silent calls: docs/benchmarks.md, "Hostile clients"). The bound leaves room for a host
# loaded by other work.
ANSWER_S = 2.5


def _first_request(spec, window: int = 2) -> bytes:
    return pb.StreamBatchesRequest(
        spec=spec.to_proto(), protocol_version=PROTOCOL_VERSION, window=window
    ).SerializeToString()


def _raw_call(channel, requests):
    """A StreamBatches call whose requests are raw bytes, as an attacker would send them."""
    stream = channel.stream_stream(
        METHOD, request_serializer=lambda b: b, response_deserializer=pb.Batch.FromString
    )
    return stream(requests)


def _held_requests(*messages: bytes):
    """Requests that send `messages`, then hold the call open (never half-close) until the
    returned event is set."""
    release = threading.Event()

    def gen():
        yield from messages
        release.wait(30)

    return gen(), release


@pytest.fixture
def own_server(tmp_path):
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"])) as srv:
        yield srv


@pytest.mark.parametrize(
    "report",
    [
        pb.StreamBatchesRequest(batches_taken=2**63).SerializeToString(),
        pb.StreamBatchesRequest(batches_taken=2**64 - 1).SerializeToString(),
        b"\xff\xff\xff\xff garbage",
    ],
    ids=["2^63", "2^64-1", "garbage"],
)
def test_a_bad_credit_report_ends_its_own_stream_and_info_still_answers(
    own_server, make_spec, report
):
    target = own_server.targets[0]
    requests, release = _held_requests(_first_request(make_spec(order={"epochs": 0})), report)
    try:
        with dial(target) as channel:
            call = _raw_call(channel, requests)
            with pytest.raises(grpc.RpcError) as e:
                for _ in call:
                    # Meanwhile every other caller is served as usual.
                    with InputClient(target) as other:
                        other.info()
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert "credit report" in e.value.details()
            with InputClient(target) as other:
                other.info()
                with other.batches(make_spec()) as it:
                    next(it)
    finally:
        release.set()


def test_a_report_of_no_more_than_was_sent_is_kept(own_server, make_spec):
    """The bound is what was sent: an honest client's reports, at any pace, never trip it."""
    with InputClient(own_server.targets[0]) as client:
        with client.batches(make_spec(), prefetch=1) as it:
            got = sum(1 for _ in it)
    assert got > 10


def _silent_calls(channel, n: int, method: str = METHOD):
    """`n` calls of `method` that never send their request; the event ends them."""
    release = threading.Event()
    outcomes: queue.Queue = queue.Queue()

    def silent():
        release.wait(60)
        yield from ()

    def run(call):
        try:
            for _ in call:
                pass
            outcomes.put(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            outcomes.put(e.code())

    stream = channel.stream_stream(
        method, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    for _ in range(n):
        threading.Thread(target=run, args=(stream(silent()),), daemon=True).start()
    return release, outcomes


@pytest.mark.parametrize(
    "method", [METHOD, "/input_server.v1.InputService/GetInfo", "/grpc.health.v1.Health/Watch"]
)
def test_silent_calls_leave_health_info_and_streams_answering(own_server, make_spec, method):
    target = own_server.targets[0]
    with dial(target) as channel:
        release, outcomes = _silent_calls(channel, 24, method)
        try:
            time.sleep(1.0)  # every silent call has reached the server
            started = time.monotonic()
            assert health(target) == 1  # SERVING
            assert time.monotonic() - started < ANSWER_S
            with InputClient(target) as other:
                started = time.monotonic()
                other.info()
                if method != "/input_server.v1.InputService/GetInfo":
                    assert time.monotonic() - started < ANSWER_S
                    with other.batches(make_spec()) as it:
                        next(it)
            # The ones beyond the cap were refused at once; the rest end at the deadline.
            codes = [outcomes.get(timeout=15) for _ in range(24)]
        finally:
            release.set()
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
    if method == METHOD:
        assert grpc.StatusCode.DEADLINE_EXCEEDED in codes


def test_one_tcp_connections_silent_calls_hold_few_readers(tmp_path):
    """A reader thread waits for each call's first request and ends only when gRPC delivers the
    call's end, which a flood delays: one connection's silent health calls get no more readers
    than `CONNECTION_READERS` allows (the rest refused before a thread), and a probe on a
    connection of its own is answered."""
    from input_server.serving.call_limits import CONNECTION_READERS

    def readers() -> int:
        return sum(t.name == "first-request" for t in threading.enumerate())

    config = ServerConfig(listen=["127.0.0.1:0"], insecure_tcp=True)
    # A connection of its own: channels of one process share one otherwise (the probe's too).
    own = [("grpc.use_local_subchannel_pool", 1)]
    with Server(config) as srv, dial(srv.targets[0], options=own) as channel:
        release, outcomes = _silent_calls(channel, 24, "/grpc.health.v1.Health/Check")
        try:
            most, until = 0, time.monotonic() + 1.0
            while time.monotonic() < until:
                most = max(most, readers())
                time.sleep(0.005)
            started = time.monotonic()
            assert health(srv.targets[0]) == 1  # SERVING, on a new connection
            assert time.monotonic() - started < ANSWER_S
            refused = [outcomes.get(timeout=2) for _ in range(24 - CONNECTION_READERS["health"])]
        finally:
            release.set()
    assert most <= CONNECTION_READERS["health"], f"{most} readers for one connection"
    assert set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}


# --- Globs: one budget for the whole request ----------------------------------------------------


@pytest.fixture
def many_files(tmp_path, some_docs):
    """A folder of 300 entries, five of them small jsonl files."""
    from tests.support import jsonl_bytes, write_bytes

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(5):
        write_bytes(folder / f"part-{i}.jsonl", jsonl_bytes(some_docs[i * 10 : (i + 1) * 10]))
    for i in range(295):
        (folder / f"other-{i}.txt").write_text("x")
    return folder


def test_a_glob_named_many_times_is_walked_once(many_files, monkeypatch):
    from input_server.data import roots

    scans = []
    real_scandir = roots.os.scandir
    monkeypatch.setattr(roots.os, "scandir", lambda p: scans.append(p) or real_scandir(p))
    access = roots.DataAccess(roots=(str(many_files),), max_files=100_000)
    files = access.expand(["*.jsonl"] * 10_000)
    assert len(files) == 50_000  # each copy still names its files: the client's weighting
    assert len(scans) == 1


def test_the_glob_walk_budget_is_the_requests_not_each_globs(many_files, monkeypatch):
    from input_server.data import roots

    monkeypatch.setattr(roots, "MAX_GLOB_VISITS", 1_000)  # each glob alone looks at 300
    access = roots.DataAccess(roots=(str(many_files),), max_files=100_000)
    assert len(access.expand([f"part-{i}*.jsonl" for i in range(3)])) == 3
    with pytest.raises(roots.InvalidSpecError, match="in all"):
        access.expand([f"part-{i}*.jsonl" for i in range(5)])


def test_the_globs_of_a_request_have_a_cpu_budget(tmp_path, monkeypatch):
    """Entries cost unequally (one a `**` walks is resolved and checked): within the visit
    bound, many `**` globs still took seconds, so the walk also stops at a CPU budget."""
    from input_server.data import roots

    folder = tmp_path / "wide"
    folder.mkdir()
    for i in range(3000):
        (folder / f"f{i}.txt").write_text("x")
    monkeypatch.setattr(roots, "MAX_GLOB_CPU_S", 0.05)
    access = roots.DataAccess(roots=(str(tmp_path),), max_files=100_000)
    assert len(access.expand(["wide/f1.tx[t]"])) == 1  # a cheap glob is within it
    with pytest.raises(roots.InvalidSpecError, match="s of CPU"):
        access.expand([f"**/f{i}.tx[t]" for i in range(200)])


def test_dot_dot_after_a_wildcard_is_invalid_argument_not_internal(target, make_spec, corpus):
    import os

    folder = os.path.dirname(corpus)
    spec = make_spec(source={"paths": [f"{folder}/*/../{os.path.basename(corpus)}"]})
    with dial(target) as channel, pytest.raises(grpc.RpcError) as e:
        list(_raw_call(channel, iter([_first_request(spec, window=0)])))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "`..` after a wildcard" in e.value.details()


# --- Resume positions checked against the data ---------------------------------------------------


def _status_of_resume(target, spec, state: bytes) -> grpc.RpcError:
    request = pb.StreamBatchesRequest(
        spec=spec.to_proto(), protocol_version=PROTOCOL_VERSION, resume_state=state
    ).SerializeToString()
    with dial(target) as channel, pytest.raises(grpc.RpcError) as e:
        list(_raw_call(channel, iter([request])))
    return e.value


def _state_dict(spec, seq, doc, offset) -> dict:
    fp = spec.data_fingerprint()
    return {"version": 1, "fingerprint": fp, "seq": seq, "doc": doc, "offset": offset}


def _state(spec, seq, doc, offset) -> bytes:
    import json

    return json.dumps(_state_dict(spec, seq, doc, offset)).encode()


def test_an_offset_past_its_document_is_invalid_argument(target, make_spec):
    spec = make_spec(batch={"packing": "concat_then_split", "seq_len": 128, "size": 4})
    with InputClient(target, token=TOKENS.get(target)) as client, client.batches(spec) as it:
        for _ in range(3):
            next(it)
        honest = it.get_state()
    d = dict(honest)
    assert d["offset"] > 0 or d["doc"] > 0
    e = _status_of_resume(target, spec, _state(spec, d["seq"], d["doc"], 10**12))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert "offset" in e.details() and "resume_state" in e.details()
    # The honest state still resumes.
    with InputClient(target, token=TOKENS.get(target)) as c, c.batches(spec, state=honest) as it:
        next(it)


def test_an_offset_under_a_packing_that_never_splits_is_invalid_argument(target, make_spec):
    spec = make_spec()  # first_fit: every batch starts at a document's start
    e = _status_of_resume(target, spec, _state(spec, 3, 5, 7))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert "offset" in e.details()


def test_a_forever_stream_refuses_a_position_near_the_top(target, make_spec):
    spec = make_spec(order={"epochs": 0})
    e = _status_of_resume(target, spec, _state(spec, 1, 2**63 - 1, 0))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert "'doc'" in e.details()


def test_states_a_stream_resumed_high_writes_read_back(target, make_spec):
    """The bound leaves room: a forever stream resumed just below 2^62 documents writes states
    past it, and each resumes."""
    spec = make_spec(order={"epochs": 0})
    with InputClient(target, token=TOKENS.get(target)) as c:
        with c.batches(spec, state=_state_dict(spec, 1, 2**62 - 1, 0)) as it:
            for _ in range(3):
                next(it)
            later = it.get_state()
        assert dict(later)["doc"] >= 2**62
        with c.batches(spec, state=later) as it:
            next(it)


def test_a_bad_model_is_named_as_written_not_where_its_link_leads(tmp_path, make_spec):
    import os

    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "real-name.bin").write_bytes(b"not a model at all")
    os.symlink(tmp_path / "hidden" / "real-name.bin", tmp_path / "alias.model")
    spec = make_spec(tokenizer={"model": "alias.model"})
    with Server(
        ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], data_roots=[str(tmp_path), os.getcwd()])
    ) as srv:
        e = _status_of_resume(srv.targets[0], spec, b"")
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert "alias.model" in e.details() and "real-name" not in e.details()


def test_a_burst_of_honest_calls_is_answered(own_server, make_spec):
    """Trainers starting at once each ask GetInfo first (`batches()` checks the protocol) and
    MaxText's launcher DescribeTokenizer: a burst past the caps on calls at once is retried by
    the client's channel (gRPC's retry policy), never an error."""
    target, spec = own_server.targets[0], make_spec()
    barrier, errors = threading.Barrier(16), []

    def ask():
        with InputClient(target) as client:
            barrier.wait(10)
            try:
                for _ in range(5):
                    client.describe_tokenizer(spec)
                    client.info()
                    health(target)
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]


@pytest.mark.parametrize("named", ["alias.jsonl", "al*.jsonl", "*/alias.jsonl"])
def test_a_bad_record_is_named_as_written_not_where_its_link_leads(tmp_path, make_spec, named):
    """Messages about a file name it the way the request reached it (a path, or a glob's
    folder and match), never the real path a link inside the roots leads to."""
    import os

    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "real-name.jsonl").write_text('{"text": "fine"}\nnot json\n')
    folder = tmp_path / "d" if named.startswith("*/") else tmp_path
    folder.mkdir(exist_ok=True)
    os.symlink(tmp_path / "hidden" / "real-name.jsonl", folder / "alias.jsonl")
    spec = make_spec(source={"paths": [named]}, order={"shuffle": False})
    with Server(
        ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], data_roots=[str(tmp_path), os.getcwd()])
    ) as srv:
        e = _status_of_resume(srv.targets[0], spec, b"")
    assert e.code() == grpc.StatusCode.DATA_LOSS, e.details()
    assert "alias.jsonl line 2" in e.details() and "real-name" not in e.details(), e.details()


@pytest.mark.parametrize("kind", ["bomb", "corrupt-gz", "not-parquet"])
def test_a_file_refused_while_opening_is_named_as_written(tmp_path, make_spec, kind):
    """The messages a file gets while it is opened (over the decompression budget, a damaged
    archive, not the format) name it as the request did, not where its link leads."""
    import gzip
    import os

    import zstandard

    (tmp_path / "hidden").mkdir()
    real = tmp_path / "hidden" / "real-name"
    if kind == "bomb":
        real.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "x"}\n' * (1 << 20)))
        alias, fmt = "alias.jsonl.zst", "jsonl"
    elif kind == "corrupt-gz":
        real.write_bytes(gzip.compress(b'{"text": "x"}\n' * 1000)[:-40] + b"\0" * 40)
        alias, fmt = "alias.jsonl.gz", "jsonl"
    else:
        real.write_bytes(b"not a parquet file at all")
        alias, fmt = "alias.parquet", "parquet"
    os.symlink(real, tmp_path / alias)
    spec = make_spec(source={"paths": [alias], "format": fmt})
    config = ServerConfig(
        listen=[f"unix://{tmp_path}/s.sock"],
        data_roots=[str(tmp_path), os.getcwd()],
        max_decompressed_mb=4,  # the bomb's 14 MB are over it
    )
    with Server(config) as srv:
        e = _status_of_resume(srv.targets[0], spec, b"")
    assert e.code() != grpc.StatusCode.OK, e.details()
    assert alias in e.details() and "real-name" not in e.details(), e.details()
