"""Another client's stream that must keep flowing beside an attack (the memory tests), and the
bounded server's peak memory meanwhile."""

from __future__ import annotations

import contextlib
import pathlib
import threading
import time
from collections.abc import Iterator, Sequence

from input_client import PipelineSpec


def other_stream_spec(docs: Sequence[str], folder) -> PipelineSpec:
    """The memory tests' other client's spec (the stream that must keep flowing beside an
    attack): 300 documents with a small sentencepiece model of their own, endless, 4 x 128,
    in process; its files written in `folder`."""
    from input_server.data.builtin_corpora import write_jsonl
    from input_server.data.tokenizers.trainers import train_sentencepiece

    folder = pathlib.Path(folder)
    return PipelineSpec(
        source={"paths": [write_jsonl(docs[:300], folder / "good.jsonl")]},
        tokenizer={"model": train_sentencepiece(docs[:300], folder / "good")},
        batch={"seq_len": 128, "size": 4},
        order={"epochs": 0},
        workers={"count": 0},
    )


def assert_still_flowing(flowing: list, seconds: float = 1.0) -> None:
    """The other client's stream (`flowing_stream`'s list) gets messages over `seconds`."""
    seen = len(flowing)
    time.sleep(seconds)
    assert len(flowing) > seen, "the other stream stopped"


def assert_peak_within(server, before: int, mib: int) -> int:
    """A bounded server's peak memory rose by less than `mib` MiB over `before` bytes; the
    peak."""
    peak = server.peak.bytes
    assert peak - before < mib << 20, (before >> 20, peak >> 20)
    return peak


@contextlib.contextmanager
def flowing_stream(target: str, spec, timeout: float = 60, started: int = 0) -> Iterator[list]:
    """Another client's raw stream of `spec` (a proto), read in a thread while the block runs:
    the list its messages' arrival times are appended to (it stops growing if the stream
    fails). With `started`, the block runs once that many messages came (at most 60 s: a
    first batch waits for the tokenizer to load, longer on a loaded host). Cancelled at its
    next message once the block ends."""
    import grpc

    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    flowing, stop = [], threading.Event()

    def read() -> None:
        with grpc.insecure_channel(target) as channel:
            stream = pb_grpc.InputServiceStub(channel).StreamBatches(
                iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
                timeout=timeout,
            )
            with contextlib.suppress(grpc.RpcError):
                for _ in stream:
                    flowing.append(time.monotonic())
                    if stop.is_set():
                        stream.cancel()
                        return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while len(flowing) < started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield flowing
    finally:
        stop.set()
        thread.join(30)
