"""The `input-server` command: serve, demo, info, tune, bench, tokenizer train."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import tomllib

# Before grpc's import: its core logs (INFO) every failed TLS handshake, an unbounded log.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from input_client.spec import PipelineSpec, SpecError  # noqa: E402
from input_server.tools import demo as demo_module  # noqa: E402
from input_server.tools import show_info, tokenizer_train, tune_cli  # noqa: E402
from input_server.tools.report import plural  # noqa: E402


def load_pipelines(path: str) -> dict[str, PipelineSpec]:
    """Reads a pipelines file: each top-level table is one named spec, e.g. `[wiki.source]`.

    Relative data and model paths resolve against the file's folder.
    """
    with open(path, "rb") as f:
        try:
            tables = tomllib.load(f)
        except ValueError as e:  # TOMLDecodeError, UnicodeDecodeError, int-digit limit
            raise SpecError("(file)", path, f"is not valid TOML: {e}") from e
    base = os.path.dirname(os.path.abspath(path))
    pipelines = {}
    for name, spec_tables in tables.items():
        if not isinstance(spec_tables, dict):
            raise SpecError(name, spec_tables, "must be a table of spec tables ([NAME.source] ...)")
        try:
            pipelines[name] = PipelineSpec.from_dict(spec_tables).resolve_paths(base)
        except SpecError as e:
            # The reason alone: SpecError adds ", got VALUE." again.
            tail = str(SpecError(e.key, e.value, ""))[len(f"`{e.key}` ") :]
            reason = str(e)[len(f"`{e.key}` ") : len(str(e)) - len(tail)]
            raise SpecError(f"{name}.{e.key}", e.value, reason) from e
    return pipelines


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
        return value

    return parse


def _kinds(text: str) -> tuple[str, ...]:
    from input_server.tools.bench_kinds import parse_kinds

    try:
        return parse_kinds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"must be counts like 0,1,4, got {text!r}")
    return counts


# After SIGTERM, the process exits within --grace-s and this margin, drained or not.
EXIT_MARGIN_S = 3.0


def _stopped_line(signame: str, ended: int, drained: bool, grace_s: float) -> str:
    """The one line `serve` ends with after SIGINT or SIGTERM."""
    streams = plural(ended, "stream")
    if drained:
        return f"input-server: {signame}: drained, {streams} ended; stopped."
    return (
        f"input-server: {signame}: the drain did not finish within --grace-s {grace_s:g} "
        f"({streams} to end); stopped."
    )


def _exit_now(server, line: str) -> None:
    server.remove_sockets()
    print(line, file=sys.stderr, flush=True)
    os._exit(1)


def _tune_cache(value: str | None) -> str | None:
    from input_server.autotune.remembered import default_folder

    if value == "off":
        return None
    return os.path.abspath(value) if value else default_folder()


# `serve` flags that ServerConfig takes as they are, under the same names.
SERVE_FLAGS = (
    "max_streams queue_depth grace_s token_file insecure_tcp insecure_abstract tls_cert tls_key "
    "tls_client_ca health_port socket_group stream_memory_mb max_document_mb max_files "
    "max_decompressed_mb max_open_files"
).split()


def _serve(args: argparse.Namespace) -> int:
    from input_server.errors import InputServerError
    from input_server.serving.server import Server, ServerConfig

    pipelines = {}
    for path in args.pipelines or []:
        pipelines.update(load_pipelines(path))
    optional = {
        k: v
        for k, v in (("message_tokens", args.message_tokens), ("max_workers", args.max_workers))
        if v is not None
    }
    try:
        server = Server(
            ServerConfig(
                listen=args.listen or (),
                pipelines=pipelines,
                data_roots=args.data_root or (),
                tune_cache=_tune_cache(args.tune_cache),
                **{name: getattr(args, name) for name in SERVE_FLAGS},
                **optional,
            )
        )
    except (InputServerError, OSError, ValueError) as e:
        print(f"input-server: {e}", file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        if stopping.is_set():
            return
        stopping.set()
        ending.update(signame=signal.Signals(signum).name, streams=server.active_streams())
        logging.info("%s: draining %d streams", ending["signame"], ending["streams"])
        threading.Thread(target=server.stop, name="stop", daemon=True).start()
        # Whatever a handler is doing (a stuck read, Grain closing a worker), the process
        # is gone within the drain and a few seconds: interpreter exit would otherwise join
        # every RPC thread, for as long as the slowest takes.
        line = _stopped_line(ending["signame"], ending["streams"], False, args.grace_s)
        threading.Timer(args.grace_s + EXIT_MARGIN_S, _exit_now, (server, line)).start()

    stopping = threading.Event()
    ending: dict = {}

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"input-server: serving on {' '.join(server.targets)}", flush=True)
    if server.health_port is not None:
        print(f"input-server: health (plaintext, health only) on port {server.health_port}")
    while not server.wait(timeout=1.0):
        pass
    if ending:  # as "serving on", on stdout; a drain cut short, on stderr
        print(
            _stopped_line(ending["signame"], ending["streams"], server.drained, args.grace_s),
            file=sys.stdout if server.drained else sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    # Stopped: the RPC threads have ended, or are past help (exit 1: the drain was cut
    # short); interpreter exit would wait for them.
    os._exit(0 if server.drained else 1)


def _bench(args: argparse.Namespace) -> int:
    import json

    from input_server.batching.pipeline import Pipeline
    from input_server.tools import bench

    spec = PipelineSpec.from_toml(args.spec)
    Pipeline(spec)  # missing files or model, a spec that does not fit the data: one line
    if args.kinds:
        from input_server.tools import bench_kinds

        result = bench.run_kinds(
            spec,
            args.kinds,
            min_tokens=args.min_tokens,
            rounds=args.rounds or 3,
            reference_processes=args.reference_processes,
        )
        print(bench_kinds.format_kinds_table(result))
    else:
        result = bench.run(
            spec,
            min_tokens=args.min_tokens,
            rounds=args.rounds or 5,
            reference_processes=args.reference_processes,
        )
        print(bench.format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    return 0


def _demo(args: argparse.Namespace) -> int:
    return demo_module.run_from_args(args)


def main(argv: list[str] | None = None) -> int:
    # Grain reads absl flags; this entry point does not use absl's parser.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    parser = argparse.ArgumentParser(prog="input-server", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument(
        "--listen",
        action="append",
        metavar="ADDRESS",
        help="unix:///path/to.sock, unix-abstract:NAME or HOST:PORT "
        "(repeatable; default a Unix socket in $XDG_RUNTIME_DIR, else in "
        "a private $TMPDIR/input-server-UID/ folder); abstract sockets and "
        "loopback TCP need --token-file or --insecure-*; any other TCP address "
        "(0.0.0.0, [::], a host's IP or name) needs --tls-cert, --tls-key and --token-file",
    )
    serve.add_argument(
        "--pipelines",
        action="append",
        metavar="FILE",
        help="TOML file of named pipelines ([NAME.source] ...), repeatable",
    )
    serve.add_argument(
        "--data-root",
        action="append",
        metavar="DIR",
        help="a folder requests may read files and models from (repeatable); "
        "default the working directory. Paths resolve (links followed) "
        "and must land inside a root; relative ones join the first root",
    )
    serve.add_argument(
        "--token-file",
        metavar="FILE",
        help="the token clients must send on abstract sockets and TCP (a file only you can read)",
    )
    for kind, what in (("tcp", "loopback TCP"), ("abstract", "unix-abstract: sockets")):
        serve.add_argument(
            f"--insecure-{kind}",
            action="store_true",
            help=f"serve {what} without a token (open to every local user)",
        )
    for flag, what in (
        (
            "--tls-cert",
            "PEM certificate chain (with --tls-key): TCP listeners serve TLS (Unix sockets stay "
            "plaintext); re-read on change for new connections, open streams go on",
        ),
        ("--tls-key", "the unencrypted PEM private key of --tls-cert"),
        ("--tls-client-ca", "PEM CAs that TLS clients' certificates must chain to (mutual TLS)"),
    ):
        serve.add_argument(flag, metavar="FILE", help=what)
    serve.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help="serve gRPC health alone, plaintext, no token, on PORT of every interface, for "
        "probes that cannot use TLS or a token (Kubernetes' grpc: probe dials the pod IP) and a "
        "Unix-socket sidecar's; other methods are UNIMPLEMENTED there; NOT_SERVING in a drain",
    )
    serve.add_argument(
        "--socket-group",
        metavar="GROUP",
        help="let this group use the Unix socket files too (mode 0660)",
    )
    serve.add_argument(
        "--stream-memory-mb",
        type=_positive(float),
        default=2048.0,
        help="the most memory one stream may hold; larger specs are refused",
    )
    serve.add_argument(
        "--max-document-mb",
        type=_positive(float),
        default=64.0,
        help="a longer document ends its stream with INVALID_ARGUMENT",
    )
    serve.add_argument(
        "--max-files",
        type=_positive(int),
        default=100_000,
        help="the most files a request may name after globbing",
    )
    serve.add_argument(
        "--max-decompressed-mb",
        type=_positive(float),
        default=1024.0,
        help="the most .gz/.zst text and Parquet columns held decoded in memory at once, a process "
        "(idle Parquet columns given back first); past it RESOURCE_EXHAUSTED naming the file",
    )
    serve.add_argument(
        "--max-open-files",
        type=_positive(int),
        metavar="N",
        help="data files each process keeps open at once, least recently used closed first "
        "(default a quarter of the descriptor limit, at most 1024)",
    )
    serve.add_argument(
        "--max-workers",
        type=int,
        metavar="N",
        help="worker processes across all streams (default the CPU count)",
    )
    serve.add_argument(
        "--tune-cache",
        metavar="DIR|off",
        help='where "auto" worker choices persist across restarts (default '
        "$XDG_CACHE_HOME/input-server/tune); off = tune again each start",
    )
    serve.add_argument("--max-streams", type=int, default=8, help="concurrent streams")
    serve.add_argument(
        "--queue-depth", type=int, default=4, help="batches each stream prepares ahead"
    )
    serve.add_argument("--grace-s", type=float, default=5.0, help="drain time on SIGTERM")
    serve.add_argument(
        "--message-tokens",
        type=int,
        metavar="N",
        help="smaller batches share gRPC messages of up to N tokens (gRPC's "
        "cost is mostly per message); default 262144",
    )
    serve.set_defaults(run=_serve)

    demo = sub.add_parser("demo", help="train a tiny JAX model through the server, offline")
    demo_module.add_arguments(demo)
    demo.set_defaults(run=_demo)

    bench = sub.add_parser(
        "bench",
        help="measure a spec's throughput against the tokenizer's "
        "limit and a MaxText-style Grain pipeline",
    )
    bench.add_argument("spec", help="pipeline spec TOML")
    bench.add_argument("--json", metavar="OUT", help="also write the result as JSON")
    bench.add_argument(
        "--min-tokens",
        type=_positive(int),
        default=8_000_000,
        help="tokens each measured run delivers",
    )
    bench.add_argument(
        "--rounds",
        type=_positive(int),
        help="rounds, each measuring everything back to back; a ratio is the "
        "median of the rounds' ratios, a rate the best round's (default 5; 3 with --kinds)",
    )
    bench.add_argument(
        "--kinds",
        type=_kinds,
        metavar="all|KIND,...",
        help="a row per tokenizer kind (sentencepiece, huggingface, tiktoken) on the spec's "
        "corpus: the spec's model for its kind, the others trained on the corpus with its "
        "vocabulary size; the server over a Unix socket only",
    )
    bench.add_argument(
        "--reference-processes",
        type=_counts,
        metavar="N,...",
        help="worker process counts to run the MaxText-style reference at, the best one "
        "compared (default 0,1,CORES)",
    )
    bench.set_defaults(run=_bench)

    show_info.add_parser(sub, positive=_positive(float))

    tune_cli.add_parser(sub)

    tokenizer_train.add_parser(sub)

    from input_server.errors import InputServerError

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.run(args)
    except (SpecError, ConnectionError, OSError, InputServerError) as e:
        print(f"input-server: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
