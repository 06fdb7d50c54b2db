"""The pipeline through a real server process and the client, as a sidecar runs it, with the CPU
each side takes per token and what the server holds (memory, threads) while it streams."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time

import numpy as np

from input_client.spec import PipelineSpec
from input_client.wire import PROTOCOL_VERSION


def rate_of(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def consume(batches, count_tokens, other_process=None, on_last=None) -> dict:
    """Times a batch iterator after its first batch (start-up is not throughput), with the CPU
    time it took per real token: this process's (all threads but `on_last`'s own, when it has
    `cpu_s()`), and `other_process`'s (a psutil.Process, the server) apart. `on_last(result)`
    adds what it measures once the last batch is in (before the stream closes)."""

    def own_cpu() -> float:
        return time.process_time() - (on_last.cpu_s() if hasattr(on_last, "cpu_s") else 0.0)

    def other_cpu() -> float:
        return sum(other_process.cpu_times()[:2]) if other_process is not None else 0.0

    it = iter(batches)
    first = next(it)
    tokens, rows, slots = 0, 0, 0
    start, cpu, other = time.perf_counter(), own_cpu(), other_cpu()
    for batch in it:
        seg = count_tokens(batch)
        tokens += int(np.count_nonzero(seg))
        rows += 1
        slots += seg.size
    elapsed = time.perf_counter() - start
    # The sampling thread's CPU is read as of its last sample (up to 0.1 s old): over a short
    # stream the difference can dip below zero (a loaded host's run read -0.08 cores).
    cpu, other = max(0.0, own_cpu() - cpu), other_cpu() - other
    del first
    result = {
        "tokens": tokens,
        "batches": rows,
        "seconds": elapsed,
        "tokens_per_s": rate_of(tokens, elapsed),
        "packing_efficiency": tokens / slots if slots else 0.0,
        "cpu_ns_per_token": 1e9 * cpu / tokens if tokens else 0.0,
    }
    if other_process is not None:
        result["other_cpu_ns_per_token"] = 1e9 * other / tokens if tokens else 0.0
    if on_last is not None:
        on_last(result)
    return result


class Held:
    """The most the server process and its worker processes hold while it streams, sampled
    every 0.1 s on a thread of this process: RSS (all of them), threads (the server's) and
    worker processes. Its own CPU (`cpu_s`) is not the client's: scanning /proc ten times a
    second cost 5-7.6 ns a token at 4 M tokens/s, counted as the client's before."""

    def __init__(self, process):
        self.process = process
        self.peak = {"server_rss_mb": 0.0, "server_threads": 0, "server_worker_processes": 0}
        self._stop = threading.Event()
        self._cpu_s = 0.0  # this thread's CPU, as of its last sample
        self._thread = threading.Thread(target=self._run, name="bench-held", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._sample():  # at once, then every 0.1 s: a short stream is sampled too
            self._cpu_s = time.thread_time()
            if self._stop.wait(0.1):
                return

    def cpu_s(self) -> float:
        """The sampling thread's CPU so far (to its last sample: within one sample's)."""
        return self._cpu_s

    def _sample(self) -> bool:
        import psutil

        try:
            children = self.process.children(recursive=True)
            rss = self.process.memory_info().rss
            for c in children:
                with contextlib.suppress(psutil.Error):
                    rss += c.memory_info().rss
            now = {
                "server_rss_mb": rss / (1 << 20),
                "server_threads": self.process.num_threads(),
                "server_worker_processes": len(children),
            }
        except psutil.Error:
            return False
        self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}
        return True

    def __call__(self, result: dict) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # and at the stream's last batch
        result.update(self.peak)


def _past_pending_backend(client, spec: PipelineSpec, timeout_s: float = 120.0) -> int:
    """Takes batches of `spec` while its fast backend loads behind the stream (the reference
    serving meanwhile; loading Llama 3's takes seconds), a stream after another if one ends
    first, until the backend is chosen: a sidecar's throughput is its chosen backend's. Returns
    the batches taken."""
    deadline, taken = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        with client.batches(spec, prefetch=2) as batches:
            for _ in batches:
                taken += 1
                if not any(s.tokenizer_backend_pending for s in client.info().streams):
                    return taken
                if time.monotonic() > deadline:
                    break
    return taken


def _audits(client, timeout_s: float = 10.0) -> dict:
    """What the reference verified of the backend's groups while the stream served (the audits
    follow the stream's room to spare: a loop that takes all it gets leaves little), from the
    server's totals once the ended stream is counted in them."""
    deadline = time.monotonic() + timeout_s
    while (t := client.info().totals).streams_opened > sum(t.stream_ends.values()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return {"backend_groups": t.backend_groups, "audited_groups": t.audited_groups}


def _measured_stream(client, spec: PipelineSpec, server) -> dict:
    """`consume`'s figures for a stream of `spec` served by `server` (a psutil.Process), the
    client's CPU and the server's apart. A fast backend loads behind a stream's first group
    (`tokenizers.behind`): streams before it take batches until it is chosen (a short one
    could end first); the measured stream starts with it loaded, and its audits are the
    server's totals' growth over it."""
    before_backend = _past_pending_backend(client, spec)
    audits = _audits(client)
    with client.batches(spec, prefetch=2) as it:
        result = consume(it, lambda b: b["inputs_segmentation"], server, on_last=Held(server))
    result.update({k: n - audits[k] for k, n in _audits(client).items()})
    # This process is the client; the server's CPU is the other process's.
    result["client_cpu_ns_per_token"] = result.pop("cpu_ns_per_token")
    result["server_cpu_ns_per_token"] = result.pop("other_cpu_ns_per_token")
    result["batches_before_backend"] = before_backend
    return result


def bench_server(spec: PipelineSpec, transport: str, server_args: tuple[str, ...] = ()) -> dict:
    """The same pipeline through a real server process and the client, as a sidecar runs:
    `input-server serve [server_args]` in its own process, over a Unix socket or loopback TCP."""
    import secrets
    import socket
    import subprocess
    import sys

    import grpc
    import psutil

    from input_client import InputClient
    from input_client.auth import TokenInterceptor, read_token_file
    from input_client.proto import pb, pb_grpc
    from input_client.wire import MESSAGE_OPTIONS

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-"))
        token_file = None
        if transport == "unix":
            target = f"unix://{tmp}/bench.sock"
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                target = f"127.0.0.1:{s.getsockname()[1]}"
            # As a TCP deployment runs: with a token (checked once per stream, not per batch).
            token_file = os.path.join(tmp, "token")
            with os.fdopen(
                os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w"
            ) as f:
                f.write(secrets.token_hex(16))
            server_args = ("--token-file", token_file, *server_args)
        # The spec's own folders are the server's data roots.
        roots = {
            os.path.dirname(p.split("*")[0].split("?")[0].split("[")[0]) or "."
            for p in (*(q for s in spec.sources for q in s.paths), spec.tokenizer.model)
            if p
        }
        server_args = (*server_args, *(a for r in sorted(roots) for a in ("--data-root", r)))
        server = subprocess.Popen(
            [sys.executable, "-m", "input_server.cli", "serve", "--listen", target, *server_args],
            stdout=subprocess.DEVNULL,
        )
        stack.callback(server.wait, 30)
        stack.callback(server.terminate)
        client = stack.enter_context(
            InputClient(target, connect_timeout_s=60, token_file=token_file)
        )
        result = _measured_stream(client, spec, psutil.Process(server.pid))
        # Wire size, from the raw messages of a short second stream, on a channel of its own
        # (the client's is its own business).
        channel = stack.enter_context(grpc.insecure_channel(target, options=MESSAGE_OPTIONS))
        if token_file is not None:
            channel = grpc.intercept_channel(channel, TokenInterceptor(read_token_file(token_file)))
        stub = pb_grpc.InputServiceStub(channel)
        wire, tokens = 0, 0
        call = stub.StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec.to_proto(), protocol_version=PROTOCOL_VERSION)])
        )
        for i, msg in enumerate(call):
            wire += msg.ByteSize()
            tokens += msg.num_tokens + sum(b.num_tokens for b in msg.following)
            if i >= 20 or msg.end_of_data:
                break
        call.cancel()
    return {
        **result,
        "transport": transport,
        "wire_bytes_per_token": wire / tokens if tokens else 0.0,
    }
