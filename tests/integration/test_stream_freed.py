"""A stream its client cancels is freed when it ends, not when Python's garbage collector next
runs (issue 50's review): a stream and its credit were a reference cycle (the credit called
the stream back through a bound method), so each cancelled stream kept its pipeline, its slot
and gRPC's call until a collection. gRPC's core counts a call the server has not freed against
the connection's concurrent streams (`server.CONNECTION_CALLS_PCT`); scripts/tools/fuzz.py saw new
calls refused so (UNAVAILABLE, RST_STREAM REFUSED_STREAM). Here the collector is off in this
process, which runs the server, while one channel opens and cancels streams; then a
collection that keeps what it finds (`gc.DEBUG_SAVEALL`) finds no stream. The client's side
likewise: a closed iterator leaves no gRPC call to the collector, and one left open is closed
when its program exits."""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
import textwrap
import time

from input_client import InputClient
from input_server.serving.server import Server, ServerConfig
from input_server.serving.stream import Stream

STREAMS = 20


@contextlib.contextmanager
def collector_off(kind: type):
    """The collector off within the block; then one collection that keeps what it finds,
    and the list yielded gets the objects of `kind` it found (left to the collector)."""
    kept: list = []
    gc.collect()
    gc.disable()
    try:
        yield kept
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kept.extend(o for o in gc.garbage if isinstance(o, kind))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_cancelled_stream_is_freed_without_the_garbage_collector(short_tmp, make_spec):
    spec = make_spec()
    with Server(ServerConfig(listen=[f"unix://{short_tmp}/s.sock"])) as srv:
        with InputClient(srv.targets[0], connect_timeout_s=30) as client:
            with collector_off(Stream) as kept:
                rows = []
                for _ in range(STREAMS):
                    with client.batches(spec) as it:  # left after its first batch
                        rows.append(len(next(it)["inputs"]))
                deadline = time.monotonic() + 30
                while srv.active_streams() and time.monotonic() < deadline:
                    time.sleep(0.05)  # the server's side of each stream ends on its threads
    assert rows == [spec.batch.size] * STREAMS
    assert srv.active_streams() == 0
    assert kept == [], f"{len(kept)} of {STREAMS} cancelled streams were left to the collector"


def test_a_closed_iterator_leaves_no_grpc_call_to_the_collector(short_tmp, make_spec):
    """The client's side: a closed iterator's gRPC call is freed as it closes. A call left to
    the collector was finalized by the interpreter's last collection at exit, whose
    `_Rendezvous.__del__` takes the call's lock: a daemon thread of gRPC's that the exit had
    frozen holding it hung the process after its last line (2 of ~76 runs beside a CPU burner;
    tests/system/test_import_isolation.py and test_client_dist.py timed out so in CI)."""
    import grpc._channel

    spec = make_spec()
    with Server(ServerConfig(listen=[f"unix://{short_tmp}/s.sock"])) as srv:
        with InputClient(srv.targets[0], connect_timeout_s=30) as client:
            with collector_off(grpc._channel._Rendezvous) as kept:
                counts = []
                for ended in (True, False, True, False):  # run to its end, or left early
                    with client.batches(spec) as it:
                        counts.append(sum(1 for _ in it) if ended else len(next(it)["inputs"]))
    assert counts[0] == counts[2] > 10 and counts[1] == counts[3] == spec.batch.size
    assert kept == [], f"{len(kept)} gRPC calls of 4 closed iterators were left to the collector"


def test_an_iterator_left_open_is_closed_at_exit(server, make_spec):
    """A script that ends with its iterator open (a training loop that stops taking batches)
    has it closed by the client's exit handler, while gRPC's threads still run: no call is
    left for the interpreter's final collection (see above), open or cancelled."""
    spec = make_spec()
    code = textwrap.dedent(f"""
        import atexit, gc, json
        def open_calls():  # registered first, so it runs after the client's own handler
            import grpc._channel
            gc.collect()
            calls = [o for o in gc.get_objects() if isinstance(o, grpc._channel._Rendezvous)]
            print(json.dumps({{"left": len(calls)}}))
        atexit.register(open_calls)
        from input_client import InputClient, PipelineSpec
        spec = PipelineSpec.from_dict(json.loads({json.dumps(json.dumps(spec.to_dict()))}))
        client = InputClient({server.targets[0]!r}, connect_timeout_s=30)
        it = client.batches(spec)
        first = next(it)
        print(json.dumps({{"rows": len(first["inputs"])}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines == [{"rows": spec.batch.size}, {"left": 0}], out.stdout
