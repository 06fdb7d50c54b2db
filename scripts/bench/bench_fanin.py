"""Fan-in and TLS side by side in one run; prints a table and JSON. Needs two cores and `taskset`.

  python scripts/bench/bench_fanin.py --builtin pydoc-topics [--rounds 3] [--json OUT]
  python scripts/bench/bench_fanin.py --corpus FILE.jsonl --model SPM.model

One server against two servers each pinned to its own core (`taskset`), the same spec fanned in
by one client, and one server over loopback TCP with TLS against the same without. Each server
process runs the pipeline in its own process (`workers.count = 0`), so its core is the limit;
rounds interleave the cases so that the host's drift falls on all of them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

from input_client import InputClient
from input_client.spec import PipelineSpec
from input_server.batching.grain_adapter import ensure_absl_flags_parsed
from input_server.testing import corpus
from input_server.testing.processes import cli_argv, free_port, write_token_file

CASES = ("one_server", "two_servers", "two_servers_arrival", "tcp_plaintext", "tcp_tls")


class _Serve:
    """`input-server serve ARGS` pinned to `core`, started and serving."""

    def __init__(self, core: int, args: list[str], log):
        taskset = shutil.which("taskset")
        if taskset is None:
            raise RuntimeError("bench_fanin needs `taskset` (util-linux) to pin the servers")
        argv = [taskset, "-c", str(core), *cli_argv("serve")]
        self.p = subprocess.Popen(
            [*argv, *args], stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.p.stdout], daemon=True).start()
        try:
            line = lines.get(timeout=120)
        except queue.Empty:
            line = ""
        if "serving on" not in line:
            self.close()
            raise RuntimeError(f"serve {' '.join(args)} did not start")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, 15)
        self.p.wait(30)


def _stream(open_batches: Callable[[], object], min_tokens: int) -> dict:
    """Tokens per second after the first batch, until `min_tokens` real tokens."""
    with open_batches() as it:
        next(it)  # start-up is not throughput
        tokens, start, cpu = 0, time.perf_counter(), time.process_time()
        while tokens < min_tokens:
            tokens += int(np.count_nonzero(next(it)["inputs_segmentation"]))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        # The trainer's side: what the client (fetch threads, decoding) takes of its host.
        "client_cpu_ns_per_token": 1e9 * cpu / tokens,
    }


def _tls_files(tmp: str) -> tuple[str, str, str]:
    """A CA made now and a certificate for 127.0.0.1 it signed: (CA, certificate, key) files."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_file, cert_file, key_file = (os.path.join(tmp, n) for n in ("ca", "crt", "key"))
    ca.cert_pem.write_to_path(ca_file)
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    os.chmod(key_file, 0o600)  # the server refuses a key others may read
    return ca_file, cert_file, key_file


def _clients(stack: contextlib.ExitStack, tmp: str, data: list[str], say) -> dict:
    """The three servers started (closed when `stack` ends) and a client for each case."""
    token_file, _ = write_token_file(tmp)
    ca_file, cert_file, key_file = _tls_files(tmp)
    log = stack.enter_context(open(os.path.join(tmp, "servers.log"), "w"))  # noqa: SIM115
    plain_port, tls_port = free_port(), free_port()
    socks = [f"unix://{tmp}/s{j}.sock" for j in (0, 1)]
    say("starting the servers: core 0 (Unix socket and plaintext TCP), core 1, core 0 (TLS)")
    for server in (
        _Serve(0, ["--listen", socks[0], "--listen", f"127.0.0.1:{plain_port}",
                   "--token-file", token_file, *data], log),
        _Serve(1, ["--listen", socks[1], *data], log),
        _Serve(0, ["--listen", f"127.0.0.1:{tls_port}", "--tls-cert", cert_file,
                   "--tls-key", key_file, "--token-file", token_file, *data], log),
    ):  # fmt: skip
        stack.callback(server.close)
    clients = {
        "one_server": InputClient(socks[0], connect_timeout_s=60),
        "two_servers": InputClient(socks, connect_timeout_s=60),
        "two_servers_arrival": InputClient(socks, connect_timeout_s=60),
        "tcp_plaintext": InputClient(
            f"127.0.0.1:{plain_port}", connect_timeout_s=60, token_file=token_file
        ),
        "tcp_tls": InputClient(
            f"127.0.0.1:{tls_port}", connect_timeout_s=60, token_file=token_file, tls_ca=ca_file
        ),
    }
    for c in clients.values():
        stack.callback(c.close)
    return clients


def run(
    jsonl: str,
    model: str,
    *,
    rounds: int = 3,
    seq_len: int = 2048,
    batch_size: int = 8,
    min_tokens: int = 2_000_000,
    prefetch: int = 2,
    kind: str = "sentencepiece",
    say: Callable[[str], None] = lambda m: None,
) -> dict:
    """Every case `rounds` times, interleaved; the median of each and the two ratios. `kind`:
    the tokenizer; another than sentencepiece is trained on the corpus (as `bench --kinds`)
    next to it."""
    if (os.cpu_count() or 1) < 2:
        raise RuntimeError("bench_fanin needs two cores: one per server")
    spec = PipelineSpec(source={"paths": [jsonl]}, tokenizer={"model": model})
    if kind != spec.tokenizer.kind:
        from input_server.benchmark.kinds import make_models
        from input_server.benchmark.throughput import corpus_texts

        folder = os.path.join(os.path.dirname(os.path.abspath(jsonl)), "bench-fanin-models")
        os.makedirs(folder, exist_ok=True)
        model = make_models(spec, corpus_texts(spec), (kind,), folder)[kind]
    spec = PipelineSpec(
        source={"paths": [jsonl]},
        tokenizer={"model": model, "kind": kind},
        batch={"seq_len": seq_len, "size": batch_size},
        order={"epochs": 0},
        workers={"count": 0},
    )
    roots = sorted({os.path.dirname(os.path.abspath(p)) for p in (jsonl, model)})
    data = [a for r in roots for a in ("--data-root", r)]
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fanin-"))
        clients = _clients(stack, tmp, data, say)
        runs: dict[str, list[dict]] = {case: [] for case in CASES}
        for r in range(rounds):
            for case in CASES:
                order = "arrival" if case.endswith("arrival") else "round_robin"
                result = _stream(
                    lambda c=clients[case], o=order: c.batches(spec, order=o, prefetch=prefetch),
                    min_tokens,
                )
                runs[case].append(result)
                say(f"round {r + 1}/{rounds} {case}: {result['tokens_per_s']:,.0f} tokens/s")

    def median(case: str) -> float:
        return float(np.median([x["tokens_per_s"] for x in runs[case]]))

    return {
        "spec": spec.to_dict(),
        "rounds": rounds,
        "host_cpus": os.cpu_count(),
        "kind": kind,
        "tokens_per_s": {case: median(case) for case in CASES},
        "two_over_one": median("two_servers") / median("one_server"),
        "tls_over_plaintext": median("tcp_tls") / median("tcp_plaintext"),
        "runs": runs,
    }


def format_table(result: dict) -> str:
    t = result["tokens_per_s"]
    return "\n".join(
        [
            f"{'case':<22}{'tokens/s (median)':>20}",
            *(f"{case:<22}{t[case]:>20,.0f}" for case in CASES),
            f"two servers / one: {result['two_over_one']:.2f}",
            f"TLS / plaintext (one server, TCP): {result['tls_over_plaintext']:.2f}",
        ]
    )


def main() -> int:
    ensure_absl_flags_parsed()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus.add_corpus_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--min-tokens", type=int, default=2_000_000)
    parser.add_argument(
        "--kind",
        default="sentencepiece",
        choices=("sentencepiece", "huggingface", "tiktoken"),
        help="the tokenizer (another than sentencepiece is trained on the corpus)",
    )
    parser.add_argument("--prefetch", type=int, default=2, help="the client's, per server")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    jsonl, model = corpus.corpus_from_arguments(parser, args)
    try:
        result = run(
            jsonl,
            model,
            rounds=args.rounds,
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            min_tokens=args.min_tokens,
            prefetch=args.prefetch,
            kind=args.kind,
            say=lambda m: print(m, file=sys.stderr),
        )
    except RuntimeError as e:
        parser.exit(2, f"{parser.prog}: {e}\n")
    print(format_table(result))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
