"""gRPC's own cost per message: a server streams prebuilt batch messages (no pipeline) to a
client over a Unix socket; prints CPU µs per message on each side, as JSON.

  python scripts/bench/bench_grpc.py [--rows 16] [--seq-len 1024] [--messages 3000] [--pace-ms 0]

Compares the sync API (what the project uses), the asyncio API on both sides, and the sync
client with gRPC's single-threaded unary-stream option, in one run. `--pace-ms` spaces the
messages as a pipeline's pace does (a message every so many ms) instead of back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import time

WINDOW_BYTES = 16 << 20


def _message(rows: int, seq_len: int):
    import numpy as np

    from input_client.proto import pb
    from input_client.wire import encode_tensors

    arrays = {
        "inputs": np.random.default_rng(0).integers(1, 1000, (rows, seq_len), np.uint16),
        "segment_lengths": np.full(rows, seq_len, np.int32),
        "segments_per_row": np.ones(rows, np.int32),
    }
    return pb.Batch(sequence_number=0, tensors=encode_tensors(arrays), num_tokens=rows * seq_len)


def _serve(target: str, use_aio: bool, rows: int, seq_len: int, count: int, pace_s: float) -> None:
    from concurrent import futures

    import grpc

    from input_client.proto import pb_grpc

    msg = _message(rows, seq_len)

    class Sync(pb_grpc.InputServiceServicer):
        def StreamBatches(self, request, context):
            for _ in range(count):
                if pace_s:
                    time.sleep(pace_s)
                yield msg

    class Aio(pb_grpc.InputServiceServicer):
        async def StreamBatches(self, request, context):
            for _ in range(count):
                if pace_s:
                    await asyncio.sleep(pace_s)
                await context.write(msg)

    if not use_aio:
        server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_InputServiceServicer_to_server(Sync(), server)
        server.add_insecure_port(target)
        server.start()
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_InputServiceServicer_to_server(Aio(), server)
        server.add_insecure_port(target)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def _cpu(process) -> float:
    """The server's CPU seconds, as the kernel reports another process's: in 10 ms ticks."""
    t = process.cpu_times()
    return t.user + t.system


def _receive(target: str, client: str, server, count: int) -> dict:
    import grpc

    from input_client.proto import pb, pb_grpc

    # This process reads its own CPU to the nanosecond (a paced client's is a few ms in all).
    def figures(start, server_cpu, client_cpu) -> dict:
        elapsed = time.perf_counter() - start
        return {
            "messages_per_s": count / elapsed,
            "server_cpu_us_per_message": 1e6 * (_cpu(server) - server_cpu) / count,
            "client_cpu_us_per_message": 1e6 * (time.process_time() - client_cpu) / count,
        }

    if client == "aio":

        async def main() -> dict:
            async with grpc.aio.insecure_channel(target) as channel:
                await channel.channel_ready()
                stub = pb_grpc.InputServiceStub(channel)
                marks = time.perf_counter(), _cpu(server), time.process_time()
                async for _ in stub.StreamBatches(iter([pb.StreamBatchesRequest()])):
                    pass
                return figures(*marks)

        return asyncio.run(main())
    options = {
        "sync-single-threaded": [("grpc.experimental.SingleThreadedUnaryStream", 1)],
        # The stream's receive window from the start, not grown by gRPC's BDP probes.
        "sync-window": [("grpc.http2.lookahead_bytes", WINDOW_BYTES)],
    }.get(client, [])
    with grpc.insecure_channel(target, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = pb_grpc.InputServiceStub(channel)
        marks = time.perf_counter(), _cpu(server), time.process_time()
        for _ in stub.StreamBatches(iter([pb.StreamBatchesRequest()])):
            pass
        return figures(*marks)


def main() -> int:
    import psutil

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=0.0,
        help="the server sends a message every this many ms (0: back to back)",
    )
    args = parser.parse_args()
    results = []
    for server_api, clients in (
        ("sync", ("sync", "sync-single-threaded", "sync-window")),
        ("aio", ("aio",)),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            target = f"unix://{tmp}/grpc.sock"
            proc = multiprocessing.get_context("spawn").Process(
                target=_serve,
                args=(
                    target,
                    server_api == "aio",
                    args.rows,
                    args.seq_len,
                    args.messages,
                    args.pace_ms / 1000,
                ),
                daemon=True,
            )
            proc.start()
            try:
                for client in clients:
                    result = _receive(target, client, psutil.Process(proc.pid), args.messages)
                    results.append({"server": server_api, "client": client, **result})
                    print(
                        f"[bench_grpc] server {server_api}, client {client}: "
                        f"{result['server_cpu_us_per_message']:.0f} + "
                        f"{result['client_cpu_us_per_message']:.0f} µs CPU per message",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.join()
    message_bytes = _message(args.rows, args.seq_len).ByteSize()
    print(
        json.dumps(
            {
                "message_bytes": message_bytes,
                "tokens_per_message": args.rows * args.seq_len,
                "pace_ms": args.pace_ms,
                "results": results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
