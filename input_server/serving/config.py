"""How to run the server: `ServerConfig`, each setting's default and help written once."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from input_server.data.tokenizers.base import AUDIT_EVERY
from input_server.serving.coalesce import MESSAGE_TOKENS
from input_server.serving.listen import is_loopback

if TYPE_CHECKING:
    from input_client.spec import PipelineSpec
    from input_server.batching.pipeline import Pipeline


def _setting(default: Any = dataclasses.MISSING, *, doc: str, factory: Any = dataclasses.MISSING):
    """A field and its help: what `input-server serve --help` prints for its flag."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": doc})


def help_of(name: str) -> str:
    """The help of `ServerConfig`'s field `name`."""
    return next(f.metadata["help"] for f in dataclasses.fields(ServerConfig) if f.name == name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How to run the server: where it listens, who may connect, what each stream may take.

    Each field's help is in its metadata (`help_of(name)`), written once: `input-server serve`
    makes a flag of every field but `pipelines` (`--max-streams` for `max_streams`) with that
    help and the field's default (its `--pipelines` reads specs from TOML files). A comment
    beside a field says what its help leaves out: where a default came from, what it means here.
    """

    listen: Sequence[str] = _setting(
        (),
        doc="unix:///path/to.sock, unix-abstract:NAME or HOST:PORT "
        "(repeatable; default a Unix socket in $XDG_RUNTIME_DIR, else in "
        "a private $TMPDIR/input-server-UID/ folder); abstract sockets and "
        "loopback TCP need --token-file or --insecure-*; any other TCP address "
        "(0.0.0.0, [::], a host's IP or name) needs --tls-cert, --tls-key and --token-file",
    )
    # Built already: a `testing.SlowPipeline` stands remote storage in for benchmarks.
    pipelines: Mapping[str, PipelineSpec | Pipeline] = _setting(
        factory=dict,
        doc="pipelines clients may ask for by name, built and checked at start-up",
    )
    # Real paths, links followed; `pipelines` are the operator's and exempt.
    data_roots: Sequence[str] = _setting(
        (),
        doc="a folder requests may read files and models from (repeatable); "
        "default the working directory. Paths resolve (links followed) "
        "and must land inside a root; relative ones join the first root",
    )
    token_file: str | None = _setting(
        None,
        doc="the token clients must send on abstract sockets and TCP (a file only you can read)",
    )
    insecure_tcp: bool = _setting(
        False, doc="serve loopback TCP without a token (open to every local user)"
    )
    insecure_abstract: bool = _setting(
        False, doc="serve unix-abstract: sockets without a token (open to every local user)"
    )
    # Re-read when they change, for new connections (`tls.CertificateFiles`).
    tls_cert: str | None = _setting(
        None,
        doc="PEM certificate chain (with --tls-key): TCP listeners serve TLS (Unix sockets stay "
        "plaintext); re-read on change for new connections, open streams go on",
    )
    tls_key: str | None = _setting(None, doc="the unencrypted PEM private key of --tls-cert")
    tls_client_ca: str | None = _setting(
        None, doc="PEM CAs that TLS clients' certificates must chain to (mutual TLS)"
    )
    # `probes.py`; 0 picks a free port.
    health_port: int | None = _setting(
        None,
        doc="serve gRPC health alone, plaintext, no token, on PORT of every interface, for "
        "probes that cannot use TLS or a token (Kubernetes' grpc: probe dials the pod IP) and a "
        "Unix-socket sidecar's; other methods are UNIMPLEMENTED there; NOT_SERVING in a drain",
    )
    # `metrics.py`: prometheus-client's own HTTP server, read from GetInfo at each scrape.
    metrics_port: int | None = _setting(
        None,
        doc="serve Prometheus metrics (input_server_*) over plain HTTP on PORT of --metrics-host "
        "(0 picks a free port); counts and seconds only, no data and no names from requests",
    )
    # None: 127.0.0.1. Off loopback the page is open to anyone who reaches the port (no TLS,
    # no token: a scraper sends neither by default), hence the explicit --insecure-metrics.
    metrics_host: str | None = _setting(
        None,
        doc="the address --metrics-port binds (default 127.0.0.1); any other than loopback "
        "needs --insecure-metrics",
    )
    insecure_metrics: bool = _setting(
        False,
        doc="let --metrics-host be off loopback (a pod IP, 0.0.0.0): the metrics are then open "
        "to anyone who can reach the port",
    )
    # Without it the socket files are 0600.
    socket_group: str | None = _setting(
        None, doc="let this group use the Unix socket files too (mode 0660)"
    )
    # What a stream holds: its queue, messages and groups in flight (RESOURCE_EXHAUSTED).
    stream_memory_mb: float = _setting(
        2048.0, doc="the most memory one stream may hold; larger specs are refused"
    )
    max_document_mb: float = _setting(
        64.0, doc="a longer document ends its stream with INVALID_ARGUMENT"
    )
    max_files: int = _setting(100_000, doc="the most files a request may name after globbing")
    # All streams' together, in each process: each file is held whole, once per process that
    # reads it (`records.DECOMPRESSED`). 1024: a C4 shard (~800 MB) fits, a 310 KB zstd bomb
    # of 3.4 GiB does not, nor do several smaller ones at once.
    max_decompressed_mb: float = _setting(
        1024.0,
        doc="the most .gz/.zst text and Parquet columns held decoded in memory at once, a "
        "process (idle Parquet columns given back first); past it RESOURCE_EXHAUSTED naming "
        "the file",
    )
    # The server raises the descriptor limit to its hard limit at start (`records.py`).
    max_open_files: int | None = _setting(
        None,
        doc="data files each process keeps open at once, least recently used closed first "
        "(default a quarter of the descriptor limit, at most 1024)",
    )
    max_workers: int = _setting(
        factory=lambda: os.cpu_count() or 1,
        doc="worker processes across all streams (default the CPU count)",
    )
    # None: kept in memory only (the CLI's default is `remembered.default_folder()`).
    tune_cache: str | None = _setting(
        None, doc='where "auto" worker choices persist across restarts'
    )
    # `data/token_cache.py`; the folder is the operator's (no request names it).
    token_cache: str | None = _setting(
        None,
        doc="a folder where each document's token ids are kept once tokenized, read back in "
        "later epochs and after restarts instead of reading and tokenizing again (default: none)",
    )
    # None: kept in memory only (the CLI's default is `tokenizers.keep.default_folder()`); the
    # folder is the operator's (no request names it), refused if others may write into it.
    tokenizer_cache: str | None = _setting(
        None,
        doc="a folder where what is derived from a tokenizer model (the tokenizer.json derived "
        "from tiktoken ranks, the fast backend gate's verdict on its probes) is kept by model "
        "digest and library versions, read back by later streams and restarts instead of "
        "computed again",
    )
    token_cache_gb: float = _setting(
        10.0, doc="the most --token-cache holds; least recently used documents go first"
    )
    # Each may run worker processes; more get RESOURCE_EXHAUSTED at once instead of starving
    # health checks.
    max_streams: int = _setting(8, doc="concurrent streams")
    # Ahead of the network: bounded memory.
    queue_depth: int = _setting(4, doc="batches each stream prepares ahead")
    # `tokenizers.base.AUDIT_EVERY`: what a fast backend's "auto" guarantees beyond its gate.
    tokenizer_audit_every: int = _setting(
        AUDIT_EVERY,
        doc="while a fast tokenizer backend serves, one group of documents in N is encoded "
        "again by the reference library and compared (a difference serves the reference's ids "
        "and moves the stream to the reference); 0: none",
    )
    # How long `stop()` lets streams end after telling them to.
    grace_s: float = _setting(5.0, doc="drain time on SIGTERM")
    # `socket_lock.py`: the server holding a socket file holds its lock; the standby waits.
    standby: bool = _setting(
        False,
        doc="start as a loaded spare: wait until the server on the same socket files has "
        "ended (SIGKILL too), then take them over at once; its clients resume there. Socket "
        "files only (unix:///PATH.sock or the default); run it beside the sidecar's server",
    )
    # `coalesce.MESSAGE_TOKENS`; a batch this big or bigger goes alone.
    message_tokens: int = _setting(
        MESSAGE_TOKENS,
        doc="smaller batches share gRPC messages of up to N tokens (gRPC's "
        f"cost is mostly per message); default {MESSAGE_TOKENS}",
    )

    def __post_init__(self):
        if self.max_streams < 1:
            raise ValueError(f"`max_streams` must be positive, got {self.max_streams}.")
        if not 0 < self.token_cache_gb < float("inf"):
            raise ValueError(f"`token_cache_gb` must be positive, got {self.token_cache_gb}.")
        if self.tokenizer_audit_every < 0:
            raise ValueError(
                f"`tokenizer_audit_every` must be 0 or more, got {self.tokenizer_audit_every}."
            )
        if self.queue_depth < 1:
            raise ValueError(f"`queue_depth` must be positive, got {self.queue_depth}.")
        if self.message_tokens < 1:
            raise ValueError(f"`message_tokens` must be positive, got {self.message_tokens}.")
        for name in ("stream_memory_mb", "max_document_mb", "max_files", "max_decompressed_mb"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}.")
        if self.max_workers < 0:
            raise ValueError(f"`max_workers` must be 0 or more, got {self.max_workers}.")
        if self.max_open_files is not None and self.max_open_files < 1:
            raise ValueError(f"`max_open_files` must be positive, got {self.max_open_files}.")
        roots = tuple(os.path.realpath(r) for r in (self.data_roots or (os.getcwd(),)))
        for r in roots:
            if not os.path.isdir(r):
                raise ValueError(f"--data-root {r!r}: not a folder.")
        object.__setattr__(self, "data_roots", roots)
        for flag in ("token_file", "tls_cert", "tls_key", "tls_client_ca"):
            if getattr(self, flag) == "":
                raise ValueError(f"--{flag.replace('_', '-')}: empty path.")
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("cert", "key") if self.tls_key is None else ("key", "cert")
            raise ValueError(
                f"--tls-{given} needs --tls-{missing} FILE too (a certificate and its key)."
            )
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError(
                "--tls-client-ca: mutual TLS needs the server's own certificate too: "
                "pass --tls-cert FILE and --tls-key FILE."
            )
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(
                f"--health-port {self.health_port}: out of range (0 to 65535; 0 picks a free port)."
            )
        self._check_metrics()
        self._check_standby()
        if self.socket_group is not None and not any(a.startswith("unix:") for a in self.listen):
            # The default socket's folder is 0700: the group could not reach the socket.
            raise ValueError(
                f"--socket-group {self.socket_group!r} applies to socket files: "
                f"add --listen unix:///PATH.sock in a folder the group can enter "
                f"(the default socket's folder is private to you)."
            )

    def _check_standby(self) -> None:
        """--standby: every address a socket file, whose lock says which server holds it."""
        other = [a for a in self.listen if not a.startswith("unix:")]
        if self.standby and other:
            raise ValueError(
                f"--standby takes over socket files only (unix:///PATH.sock, or the default "
                f"socket), not --listen {other[0]}."
            )

    def _check_metrics(self) -> None:
        """--metrics-*: a port in range, a host only with a port, off loopback only when asked."""
        if self.metrics_port is None:
            if self.metrics_host is not None or self.insecure_metrics:
                flag = "--metrics-host" if self.metrics_host is not None else "--insecure-metrics"
                raise ValueError(f"{flag} applies to the metrics page: add --metrics-port PORT.")
            return
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(
                f"--metrics-port {self.metrics_port}: out of range (0 to 65535; 0 picks a free "
                f"port)."
            )
        host = self.metrics_host or "127.0.0.1"
        if not self.insecure_metrics and not is_loopback(host):
            raise ValueError(
                f"--metrics-host {host}: not a loopback address; the metrics page has no TLS "
                f"and no token, so anyone who reaches the port reads it: pass "
                f"--insecure-metrics too if that is meant (a scraper in the pod's network), or "
                f"keep the default 127.0.0.1."
            )
