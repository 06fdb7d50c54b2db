"""The thin client against real servers and fake ones: its counters and state, resume, jax
placement with a Sharding, Orbax checkpoints, sequence checks, the wire protocol's version."""

from __future__ import annotations

import json
import time

import grpc
import numpy as np
import pytest

from input_client import InputClient, SequenceError, StreamError
from input_client.proto import pb, pb_grpc
from input_client.wire import FIELDS, PROTOCOL_VERSION, encode_tensors
from input_server.batching.pack import PackedBatch
from input_server.serving.server import Server, ServerConfig
from tests.support import assert_same_batches, run_pipeline, serve_servicer


def test_client_batches_equal_in_process_pipeline(client, make_spec):
    spec = make_spec()
    with client.batches(spec) as it:
        got = list(it)
    assert_same_batches(got, run_pipeline(spec))
    assert it.batches_yielded == len(got)
    assert it.tokens_yielded == sum(int((b["inputs_segmentation"] > 0).sum()) for b in got)


def test_get_state_is_last_yielded_and_resumes_exactly(client, make_spec):
    spec = make_spec()
    reference = run_pipeline(spec)
    with client.batches(spec, prefetch=4) as it:
        assert it.get_state() is None
        first = [next(it) for _ in range(5)]
        time.sleep(0.3)  # let the prefetch thread run ahead of the caller
        state = it.get_state()
    assert state["seq"] == 5  # of the last batch yielded, not the last one received
    state = json.loads(json.dumps(state))  # what a checkpoint keeps
    with client.batches(spec, state=state) as it:
        rest = list(it)
    assert_same_batches(first + rest, reference)


def test_wait_time_is_recorded(client, make_spec):
    with client.batches(make_spec()) as it:
        next(it)
        assert it.wait_time_s > 0


def test_missing_server_is_an_error_not_a_hang(tmp_path, make_spec):
    client = InputClient(f"unix://{tmp_path}/nobody.sock", connect_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="nobody.sock"):
        client.batches(make_spec())
    assert time.monotonic() - start < 5


def test_sharding_places_global_jax_arrays(server, make_spec):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    assert len(devices) == 8, "conftest sets XLA_FLAGS for 8 CPU devices"
    mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    spec = make_spec(batch={"size": 8})
    with InputClient(server.targets[0]) as c:
        with c.batches(spec, sharding=sharding) as it:
            placed = next(it)
        with c.batches(spec) as it:
            plain = next(it)
    for k in FIELDS:
        assert isinstance(placed[k], jax.Array)
        assert placed[k].sharding == sharding
        assert placed[k].shape == (8, 128)
        np.testing.assert_array_equal(np.asarray(placed[k]), plain[k])
        # Each of the 4 data shards holds 2 rows, replicated over the model axis.
        assert {s.data.shape for s in placed[k].addressable_shards} == {(2, 128)}


def test_orbax_checkpoint_holds_the_iterator_state_beside_the_model(server, make_spec, tmp_path):
    import orbax.checkpoint as ocp  # a dev dependency: the helper is always tested

    from input_client.checkpoint import InputStateRestore, InputStateSave

    spec = make_spec()
    model = {"w": np.arange(6.0).reshape(2, 3), "b": np.zeros(3, np.float32)}
    client = InputClient(server.targets[0])
    with client.batches(spec, prefetch=4) as it:
        head = [next(it) for _ in range(7)]
        time.sleep(0.2)  # prefetched batches are not part of the state
        with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
            mngr.save(
                7,
                args=ocp.args.Composite(
                    model=ocp.args.StandardSave(model), data=InputStateSave(it)
                ),
            )
            mngr.wait_until_finished()
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        step = mngr.latest_step()
        restored = mngr.restore(
            step,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(model), data=InputStateRestore()
            ),
        )
    assert step == 7
    np.testing.assert_array_equal(restored.model["w"], model["w"])
    assert restored.data["seq"] == 7
    with client, client.batches(spec, state=restored.data) as it:
        tail = list(it)
    assert_same_batches(head + tail, run_pipeline(spec))


class _MisnumberingServicer(pb_grpc.InputServiceServicer):
    """A server that sends the given sequence numbers: a stand-in for a broken or foreign one."""

    def __init__(self, seqs):
        self.seqs = seqs

    def GetInfo(self, request, context):
        # The client checks batches against the named pipeline's shape, as the info gives it.
        spec = pb.PipelineSpec(batch=pb.BatchShape(size=1, seq_len=4))
        return pb.GetInfoResponse(
            server_version="test", protocol_version=PROTOCOL_VERSION, pipelines={"any": spec}
        )

    def StreamBatches(self, request, context):
        batch = PackedBatch(
            np.ones((1, 4), np.int32), np.array([4], np.int32), np.array([1], np.int32)
        )
        for seq in self.seqs:
            yield pb.Batch(
                sequence_number=seq,
                tensors=encode_tensors(batch.compact()),
                state=b'{"seq": %d}' % (seq + 1),
                num_tokens=4,
            )


@pytest.mark.parametrize(
    "seqs, words",
    [
        ([0, 1, 3], "expected batch 2, got batch 3: a gap"),
        ([0, 1, 1], "expected batch 2, got batch 1: a repeat"),
    ],
    ids=["gap", "repeat"],
)
def test_sequence_gap_or_repeat_raises(tmp_path, seqs, words):
    sock = f"unix://{tmp_path}/bad.sock"
    with (
        serve_servicer(_MisnumberingServicer(seqs), sock),
        InputClient(sock, connect_timeout_s=10) as c,
        c.batches("any", reconnect_deadline_s=0) as it,
    ):
        next(it)
        next(it)
        with pytest.raises(SequenceError, match=words):
            next(it)


class _OtherProtocolServicer(pb_grpc.InputServiceServicer):
    """A server of another release: it speaks wire protocol `version` (0 = sends none)."""

    def __init__(self, version: int):
        self.version = version
        self.streams = 0

    def GetInfo(self, request, context):
        return pb.GetInfoResponse(server_version="0.0.1", protocol_version=self.version)

    def StreamBatches(self, request, context):
        self.streams += 1
        yield pb.Batch(sequence_number=0, end_of_data=True)


@pytest.mark.parametrize(
    "version, words",
    [
        (0, "speaks wire protocol one from before"),
        (
            PROTOCOL_VERSION + 1,
            f"speaks wire protocol {PROTOCOL_VERSION + 1}; the client speaks {PROTOCOL_VERSION}",
        ),
    ],
    ids=["older", "newer"],
)
def test_server_of_another_wire_protocol_is_refused_before_streaming(tmp_path, version, words):
    servicer = _OtherProtocolServicer(version)
    sock = f"unix://{tmp_path}/old.sock"
    with serve_servicer(servicer, sock), InputClient(sock, connect_timeout_s=10) as c:
        with pytest.raises(StreamError) as e:
            c.batches("any")
        assert c.info().server_version == "0.0.1"  # info still answers, for diagnosis
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert words in e.value.details and "input-server 0.0.1" in e.value.details
    assert servicer.streams == 0  # refused before any batch could be misread


def test_server_replaced_by_another_wire_protocol_while_reconnecting_is_refused(
    tmp_path, make_spec
):
    sock = f"unix://{tmp_path}/s.sock"
    real = Server(ServerConfig(listen=[sock], grace_s=1))
    other = _OtherProtocolServicer(PROTOCOL_VERSION + 1)
    try:
        with (
            InputClient(sock) as client,
            client.batches(
                make_spec(order={"epochs": 0}), prefetch=1, reconnect_deadline_s=30
            ) as it,
        ):
            next(it)
            real.stop()
            with serve_servicer(other, sock), pytest.raises(StreamError) as e:
                for _ in range(10_000):  # what had arrived before the stop, then the refusal
                    next(it)
    finally:
        real.stop(0)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"speaks wire protocol {PROTOCOL_VERSION + 1}" in e.value.details
    assert other.streams == 0  # no stream was opened on it


# --- Addresses: the default, and saying at once what no waiting can fix -----------------------


def test_a_client_without_an_address_finds_a_plain_server(short_tmp, monkeypatch, make_spec):
    import tempfile

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    with Server(ServerConfig()) as srv, InputClient(connect_timeout_s=10) as client:
        assert client.address == srv.targets[0]
        assert next(iter(client.batches(make_spec())))["inputs"].shape == (4, 128)


def test_a_client_waits_for_a_socket_that_appears_within_its_timeout(tmp_path, make_spec):
    import threading

    sock = f"unix://{tmp_path}/late.sock"
    servers = []
    starter = threading.Timer(1.5, lambda: servers.append(Server(ServerConfig(listen=[sock]))))
    starter.start()
    try:
        with InputClient(sock, connect_timeout_s=30) as client:
            start = time.monotonic()
            client.wait_ready()  # the server starting: no socket file yet
            assert 1.0 < time.monotonic() - start < 25
    finally:
        starter.join()
        for s in servers:
            s.stop(0)


def test_no_socket_file_says_so_and_suggests_serve(tmp_path):
    with InputClient(f"unix://{tmp_path}/none.sock", connect_timeout_s=1) as client:
        with pytest.raises(ConnectionError) as e:
            client.wait_ready()
    assert str(e.value) == (
        f"no input server reachable at 'unix://{tmp_path}/none.sock': no socket at "
        f"{tmp_path}/none.sock after 1 s; is `input-server serve` running?"
    )


def test_a_socket_path_without_its_scheme_fails_at_once(tmp_path, server):
    path = server.targets[0].removeprefix("unix://")
    with InputClient(path, connect_timeout_s=30) as client:
        start = time.monotonic()
        with pytest.raises(ConnectionError, match=f"is a socket file.*unix://{path}"):
            client.wait_ready()
        assert time.monotonic() - start < 2


def test_a_socket_file_nobody_answers_on_says_so(tmp_path):
    """A server killed without removing its socket leaves the file: the wait ends naming it."""
    import socket

    path = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))  # bound, never listening: connections are refused, as after a SIGKILL
    try:
        with InputClient(f"unix://{path}", connect_timeout_s=1) as client:
            with pytest.raises(ConnectionError, match="nobody answers on the socket file"):
                client.wait_ready()
    finally:
        s.close()


def test_the_client_keeps_off_the_loops_dispatch_window(client, make_spec, monkeypatch):
    """A loop that takes a batch every 30 ms: the client's request and fetch threads wait out
    the dispatch window after each `next()` (`input_client.quiet`, at most 3 ms, so never
    longer), and the batches are the pipeline's, in order."""
    from input_client import quiet

    held: list[float] = []
    real_sleep = quiet.sleep

    def recording_sleep(seconds: float) -> None:
        held.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(quiet, "sleep", recording_sleep)
    spec = make_spec(order={"epochs": 1})
    want = run_pipeline(spec)[:12]
    got = []
    with client.batches(spec, prefetch=2) as it:
        for _ in range(12):
            got.append(next(it))
            time.sleep(0.03)
    assert_same_batches(got, want)
    assert len(held) >= 5, held  # held after most batches taken (not before the first)
    assert all(0 < s <= quiet.MOST_S for s in held), held
