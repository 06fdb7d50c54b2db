"""The `input-server` command: serve, demo, info."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import tomllib

from input_client.spec import PipelineSpec, SpecError


def load_pipelines(path: str) -> dict[str, PipelineSpec]:
    """Reads a pipelines file: each top-level table is one named spec, e.g. `[wiki.source]`.

    Relative data and model paths resolve against the file's folder.
    """
    with open(path, "rb") as f:
        try:
            tables = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise SpecError("(file)", path, f"is not valid TOML: {e}") from e
    base = os.path.dirname(os.path.abspath(path))
    pipelines = {}
    for name, spec_tables in tables.items():
        if not isinstance(spec_tables, dict):
            raise SpecError(name, spec_tables, "must be a table of spec tables ([NAME.source] ...)")
        try:
            pipelines[name] = PipelineSpec.from_dict(spec_tables).resolve_paths(base)
        except SpecError as e:
            raise SpecError(f"{name}.{e.key}", e.value, str(e).split("` ", 1)[-1]) from e
    return pipelines


def _serve(args: argparse.Namespace) -> int:
    from input_server.errors import InputServerError
    from input_server.server import Server, ServerConfig

    pipelines = {}
    for path in args.pipelines or []:
        pipelines.update(load_pipelines(path))
    try:
        server = Server(ServerConfig(listen=args.listen or (), pipelines=pipelines,
                                     max_streams=args.max_streams, queue_depth=args.queue_depth,
                                     grace_s=args.grace_s))
    except (InputServerError, OSError, ValueError) as e:
        print(f"input-server: {e}", file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        logging.info("signal %d: draining", signum)
        threading.Thread(target=server.stop, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"input-server: serving on {' '.join(server.targets)}", flush=True)
    while not server.wait(timeout=1.0):
        pass
    return 0


def _info(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from input_client import InputClient

    with InputClient(args.address, connect_timeout_s=args.timeout_s) as client:
        print(json_format.MessageToJson(client.info()))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from input_server import demo

    return demo.main([])


def main(argv: list[str] | None = None) -> int:
    # Grain reads absl flags; this entry point does not use absl's parser.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    parser = argparse.ArgumentParser(prog="input-server", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--listen", action="append", metavar="ADDRESS",
                       help="unix:///path/to.sock, unix-abstract:NAME or a loopback HOST:PORT "
                            "(repeatable; default a Unix socket in $XDG_RUNTIME_DIR or /tmp)")
    serve.add_argument("--pipelines", action="append", metavar="FILE",
                       help="TOML file of named pipelines ([NAME.source] ...), repeatable")
    serve.add_argument("--max-streams", type=int, default=8, help="concurrent streams")
    serve.add_argument("--queue-depth", type=int, default=4,
                       help="batches each stream prepares ahead of the network")
    serve.add_argument("--grace-s", type=float, default=5.0, help="drain time on SIGTERM")
    serve.set_defaults(run=_serve)

    demo = sub.add_parser("demo", help="train a tiny JAX model through the server, offline")
    demo.set_defaults(run=_demo)

    info = sub.add_parser("info", help="print a running server's info")
    info.add_argument("address", help="the server's gRPC target")
    info.add_argument("--timeout-s", type=float, default=10.0)
    info.set_defaults(run=_info)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (SpecError, ConnectionError, FileNotFoundError) as e:
        print(f"input-server: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
