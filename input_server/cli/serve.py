"""`input-server serve`: run the server until SIGTERM or SIGINT; its flags are
`ServerConfig`'s fields, with their help and defaults."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import tomllib
from collections.abc import Callable

from input_client.spec import PipelineSpec, SpecError
from input_server.cli.arguments import positive
from input_server.plurals import plural
from input_server.serving.config import ServerConfig
from input_server.serving.logs import FORMATS, configure

# What a flag takes beyond its field's help and default: a metavar, another name, more help,
# or a stricter type (refused by argparse, with the usage, before ServerConfig's own checks).
FLAG_EXTRAS: dict[str, dict] = {
    "listen": {"metavar": "ADDRESS"},
    "data_roots": {"flag": "--data-root", "metavar": "DIR"},
    "token_file": {"metavar": "FILE"},
    "tls_cert": {"metavar": "FILE"},
    "tls_key": {"metavar": "FILE"},
    "tls_client_ca": {"metavar": "FILE"},
    "health_port": {"metavar": "PORT"},
    "metrics_port": {"metavar": "PORT"},
    "metrics_host": {"metavar": "HOST"},
    "socket_group": {"metavar": "GROUP"},
    "stream_memory_mb": {"type": positive(float)},
    "max_document_mb": {"type": positive(float)},
    "max_files": {"type": positive(int)},
    "max_decompressed_mb": {"type": positive(float)},
    "max_open_files": {"type": positive(int), "metavar": "N"},
    "max_workers": {"metavar": "N"},
    # The CLI's default differs from ServerConfig's (kept in memory): see `tune_cache`.
    "tune_cache": {
        "metavar": "DIR|off",
        "more": " (default $XDG_CACHE_HOME/input-server/tune); off = tune again each start",
    },
    "message_tokens": {"metavar": "N"},
    # As --tune-cache: the CLI keeps across restarts by default.
    "tokenizer_cache": {
        "metavar": "DIR|off",
        "more": " (default $XDG_CACHE_HOME/input-server/tokenizers); off = derive again each start",
    },
}
# How a flag parses its field's annotation; a field of any other type needs a line here.
PARSES = {"int": int, "int | None": int, "float": float, "str | None": str, "Sequence[str]": str}
# ServerConfig's fields the CLI reads otherwise: specs from --pipelines FILEs.
NOT_FLAGS = ("pipelines",)
FIELDS = [f for f in dataclasses.fields(ServerConfig) if f.name not in NOT_FLAGS]
# After SIGTERM, the process exits within --grace-s and this margin, drained or not.
EXIT_MARGIN_S = 3.0


def register(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run the server")
    for field in dataclasses.fields(ServerConfig):
        if field.name == "pipelines":
            serve.add_argument(
                "--pipelines",
                action="append",
                metavar="FILE",
                help="TOML file of named pipelines ([NAME.source] ...), repeatable",
            )
        else:
            _add_flag(serve, field)
    serve.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text (default) or json: one JSON object a line (time, level, logger, message; "
        "stream events with their event and fields; add -v for them, they are INFO)",
    )


def _add_flag(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
    """`--NAME` for the field `NAME`: its help, and no default of its own (an absent flag
    leaves the field's default to ServerConfig)."""
    extras = dict(FLAG_EXTRAS.get(field.name, {}))
    flag = extras.pop("flag", "--" + field.name.replace("_", "-"))
    about = field.metadata["help"] + extras.pop("more", "")
    if field.type == "bool":
        parser.add_argument(flag, dest=field.name, action="store_true", help=about)
        return
    extras.setdefault("type", PARSES[field.type])
    if field.type.startswith("Sequence["):
        extras["action"] = "append"
    parser.add_argument(flag, dest=field.name, help=about, **extras)


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


def tune_cache(value: str | None) -> str | None:
    """--tune-cache's folder: `off` none, absent the default folder."""
    from input_server.autotune.remembered import default_folder

    if value == "off":
        return None
    return os.path.abspath(value) if value else default_folder()


def tokenizer_cache(value: str | None) -> str | None:
    """--tokenizer-cache's folder: `off` none, absent the default folder."""
    from input_server.data.tokenizers.keep import default_folder

    if value == "off":
        return None
    return os.path.abspath(value) if value else default_folder()


def config_of(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig of `serve`'s flags; a flag not given keeps the field's default."""
    pipelines = {}
    for path in args.pipelines or []:
        pipelines.update(load_pipelines(path))
    given = {f.name: getattr(args, f.name) for f in FIELDS if getattr(args, f.name) is not None}
    given["tune_cache"] = tune_cache(args.tune_cache)
    given["tokenizer_cache"] = tokenizer_cache(args.tokenizer_cache)
    return ServerConfig(pipelines=pipelines, **given)


# How long a returning `serve` waits for Grain's load behind the socket before undoing what
# kept JAX out of it.
UNDO_WAIT_S = 60.0


def run(args: argparse.Namespace) -> int:
    from input_server.errors import InputServerError
    from input_server.serving import warm
    from input_server.serving.server import Server

    undo_platforms = keep_off_the_chip()  # before the server spawns any worker process
    undo = warm.keep_jax_out()  # before anything imports Grain, which imports JAX if it can
    try:
        configure(args.log_format)
        try:
            server = Server(config_of(args), waiting=_say_standby)
        except (InputServerError, OSError, ValueError) as e:
            print(f"input-server: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # stopped while it started, a standby while it waited
            return 130
        return _serve_until_stopped(server)
    finally:
        # Grain, if it still loads behind the socket, imports what it imports as `serve` let it
        # (no JAX) before a process that goes on (a test) gets its path back.
        warm.wait_loaded(UNDO_WAIT_S)
        undo()
        undo_platforms()


def _say_standby(names: list[str]) -> None:
    """A standby's line once it is loaded and waits (`Server(waiting=)`)."""
    print(f"input-server: standby: taking over {', '.join(names)} once its server ends")
    sys.stdout.flush()


def keep_off_the_chip() -> Callable[[], None]:
    """Sets `JAX_PLATFORMS=cpu` in this process's environment unless the operator set it
    (to anything), so that a process `serve` spawns which imports JAX never opens the
    accelerator: one program at a time may hold a TPU chip, and it is the trainer's.

    `warm.keep_jax_out` already keeps JAX out of `serve` and of Grain's worker processes,
    except where JAX was loaded before `serve` ran (a program that calls the CLI in-process,
    a site hook): it then leaves `sys.path` alone, the workers import JAX with Grain, and
    they read this variable as they do. JAX reads it only when it is imported, so a JAX
    already loaded in this process keeps its platforms. Returns what undoes it, for a process
    that goes on after `serve` returns."""
    if "JAX_PLATFORMS" in os.environ:
        return lambda: None
    os.environ["JAX_PLATFORMS"] = "cpu"

    def undo() -> None:
        if os.environ.get("JAX_PLATFORMS") == "cpu":
            del os.environ["JAX_PLATFORMS"]

    return undo


def _serve_until_stopped(server) -> int:
    """Serves until SIGTERM or SIGINT, drains, and exits the process: 0 drained, 1 not."""

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
        line = _stopped_line(ending["signame"], ending["streams"], False, grace_s)
        threading.Timer(grace_s + EXIT_MARGIN_S, _exit_now, (server, line)).start()

    grace_s = server.config.grace_s
    stopping = threading.Event()
    ending: dict = {}

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"input-server: serving on {' '.join(server.targets)}", flush=True)
    if server.health_port is not None:
        print(f"input-server: health (plaintext, health only) on port {server.health_port}")
    if server.metrics_port is not None:
        host = server.config.metrics_host or "127.0.0.1"
        print(f"input-server: metrics on http://{host}:{server.metrics_port}/metrics", flush=True)
    while not server.wait(timeout=1.0):
        pass
    if ending:  # as "serving on", on stdout; a drain cut short, on stderr
        print(
            _stopped_line(ending["signame"], ending["streams"], server.drained, grace_s),
            file=sys.stdout if server.drained else sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    # Stopped: the RPC threads have ended, or are past help (exit 1: the drain was cut
    # short); interpreter exit would wait for them.
    os._exit(0 if server.drained else 1)


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
