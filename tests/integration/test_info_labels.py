"""What `input-server info` says of a stream: a spec the client sent is named by its data and
model (not "(request)"), and a stream searching again says so, not its old reason."""

from __future__ import annotations

import os

from input_client import InputClient
from input_server.cli.info import format_table
from input_server.serving.server import Server, ServerConfig


def test_a_clients_spec_is_named_by_its_data_and_model(tmp_path, make_spec):
    spec = make_spec(order={"epochs": 0})
    with (
        Server(
            ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], pipelines={"named": spec})
        ) as srv,
        InputClient(srv.targets[0]) as client,
        client.batches(spec) as sent,
        client.batches("named") as named,
    ):
        next(sent)
        next(named)
        info = client.info()
    data = os.path.basename(spec.sources[0].paths[0])
    model = os.path.basename(spec.tokenizer.model)
    assert sorted(s.pipeline for s in info.streams) == ["named", f"request: {data}, {model}"]
    table = format_table(info, "unix:///s.sock")
    assert f"request: {data}" in table and "(request)" not in table, table


def test_a_stream_searching_again_says_so_not_its_remembered_reason(make_spec):
    from input_server.autotune.live import Window
    from input_server.autotune.online import OnlineSearch
    from input_server.batching.batch_stream import BatchStream
    from input_server.batching.meter import LiveMeter
    from input_server.batching.parallelism import Parallelism
    from input_server.batching.pipeline import Pipeline
    from input_server.batching.resume import Position
    from input_server.serving.retune import StreamTuner
    from input_server.serving.slots import ProcessPool, ProcessReservation

    def threads(processes: int) -> int:
        return max(1, 8 // max(1, processes))

    def taking(rate: float, blocked: float) -> Window:
        """A second of one thread at `rate` batches/s, the producer blocked (waiting for the
        loop to take) `blocked` of it."""
        n = int(rate)
        return Window(
            seconds=1.0,
            batches=n,
            tokens=100 * n,
            groups=n,
            group_s=1.0 - blocked,
            waiting_s=1.0 - blocked,
            blocked_s=blocked,
            workers=1,
        )

    # A choice settled for a slow loop (6 batches/s of the 10 one thread makes), remembered.
    first = OnlineSearch(Parallelism(0, 1), cpus=8, default_threads=threads)
    for _ in range(30):
        first.observe(taking(6, 0.4), demand=6, now=0)
        if first.settled:
            break
    assert first.settled and first.current == Parallelism(0, 1)
    remembered = f"auto, remembered: {first.tuning.summary()}"
    pipeline = Pipeline(make_spec(order={"epochs": 0}))
    stream = BatchStream(pipeline, Position(), Parallelism(0, 1), meter=LiveMeter())
    search = OnlineSearch(
        Parallelism(0, 1), cpus=8, default_threads=threads, remembered=first.tuning
    )
    tuner = StreamTuner(
        stream,
        search,
        taken=lambda: 0,
        processes=ProcessReservation(ProcessPool(0)),
        remember=print,
        reason=remembered,
    )
    try:
        assert tuner.reason == remembered
        # The loop now takes everything one thread makes: after the cool-down, a new search.
        for _ in range(40):
            tuner._observe(taking(10, 0.0), 10.0, 1.0, 0.0)
            if not search.settled:
                break
        assert not search.settled
        assert tuner.reason.startswith("auto: searching…"), tuner.reason
        assert "remembered" not in tuner.reason
    finally:
        stream.close()
