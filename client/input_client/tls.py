"""TLS for the client: its options (`TlsSettings`), the channel they open (`open_channel`),
the `ssl` context that verifies as gRPC will (`verifying_context`, for `tls_diagnosis`), and the
refusal of a token sent in the clear. grpcio and the standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import ssl
from collections.abc import Sequence
from typing import Any

import grpc


@dataclasses.dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """How the client secures a TCP connection (`InputClient`'s `tls*` options).

    Attributes:
      enabled: TLS at all; any other option implies it. With no `ca`, gRPC's default roots
        verify the server (a certificate from a public CA).
      ca: a PEM file of the CA certificates that the server's certificate must chain to.
      cert, key: a PEM certificate chain and its unencrypted key, for a server that requires
        client certificates (mutual TLS); both or neither.
      server_name: the name the server's certificate must hold, when it is not the host
        dialed (gRPC's `grpc.ssl_target_name_override`): e.g. dialing an IP.

    Raises:
      ValueError: `cert` without `key` or the reverse, or an empty path or name.
    """

    enabled: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self):
        for name in ("ca", "cert", "key", "server_name"):
            if getattr(self, name) == "":
                raise ValueError(f"`tls_{name}` is empty; give a path or leave it out.")
        if (self.cert is None) != (self.key is None):
            raise ValueError(
                "pass both `tls_cert` and `tls_key` (a client certificate and its key, for "
                "mutual TLS), or neither."
            )
        if any(getattr(self, n) is not None for n in ("ca", "cert", "key", "server_name")):
            object.__setattr__(self, "enabled", True)

    @classmethod
    def of(
        cls,
        *,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
    ) -> TlsSettings:
        """From `InputClient`'s keyword arguments."""
        return cls(
            enabled=bool(tls), ca=tls_ca, cert=tls_cert, key=tls_key, server_name=tls_server_name
        )

    def keywords(self) -> dict[str, Any]:
        """`InputClient`'s keyword arguments for these settings (the inverse of `of`)."""
        return {
            "tls": self.enabled,
            "tls_ca": self.ca,
            "tls_cert": self.cert,
            "tls_key": self.key,
            "tls_server_name": self.server_name,
        }

    def options(self) -> str:
        """The options as a caller wrote them, for messages (paths, never contents)."""
        given = [f"tls_{n}={getattr(self, n)}" for n in ("ca", "cert", "key", "server_name")]
        return ", ".join(g for g in given if not g.endswith("=None")) or "tls=True"


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError as e:
        raise OSError(f"`{option}` {path}: cannot read it ({e.strerror}).") from None


def ssl_reason(e: Exception) -> str:
    """OpenSSL's words without the source location."""
    text = str(e.args[1] if isinstance(e, ssl.SSLError) and len(e.args) > 1 else e)
    return re.sub(r"^\[\w+\]\s*|\s*\(_ssl\.c:\d+\)$", "", text)


def verifying_context(settings: TlsSettings) -> ssl.SSLContext:
    """An `ssl` context verifying as gRPC will (CA, client certificate, names).

    Raises:
      OSError, ValueError: a file cannot be read or is not PEM of its kind (one line naming it).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
    if settings.ca is not None:
        data = _read(settings.ca, "tls_ca")
        try:
            ctx.load_verify_locations(cadata=data.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as e:
            raise ValueError(
                f"`tls_ca` {settings.ca}: not a PEM file of CA certificates ({ssl_reason(e)})."
            ) from None
    else:
        _load_grpc_roots(ctx)
    if settings.cert is not None:
        for option, path in (("tls_cert", settings.cert), ("tls_key", settings.key)):
            _read(path, option)
        try:
            ctx.load_cert_chain(settings.cert, settings.key, password=_no_password)
        except (ssl.SSLError, ValueError) as e:
            mismatch = "KEY_VALUES_MISMATCH" in str(e) or "values mismatch" in str(e)
            raise ValueError(
                f"`tls_key` {settings.key}: does not match `tls_cert` {settings.cert}."
                if mismatch
                else f"`tls_cert` {settings.cert} / `tls_key` {settings.key}: not a PEM "
                f"certificate and unencrypted key ({ssl_reason(e)})."
            ) from None
    ctx.set_alpn_protocols(["h2"])
    return ctx


def _load_grpc_roots(ctx: ssl.SSLContext) -> None:
    """The roots gRPC verifies `tls=True` with, so the diagnosis judges as the channel will:
    $GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, else grpcio's bundle (not the system's list)."""
    bundled = os.path.join(os.path.dirname(grpc.__file__), "_cython", "_credentials", "roots.pem")
    for path in (os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"), bundled):
        if path and os.path.isfile(path):
            with contextlib.suppress(ssl.SSLError, OSError, ValueError):
                ctx.load_verify_locations(cafile=path)
                return
    ctx.load_default_certs()


def _no_password() -> bytes:
    raise ValueError("the key is encrypted; gRPC needs it unencrypted")


def credentials(settings: TlsSettings) -> grpc.ChannelCredentials:
    """gRPC channel credentials of `settings`, its files checked first (`verifying_context`).

    Raises:
      OSError, ValueError: as `verifying_context`.
    """
    verifying_context(settings)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(settings.ca, "tls_ca") if settings.ca else None,
        private_key=_read(settings.key, "tls_key") if settings.key else None,
        certificate_chain=_read(settings.cert, "tls_cert") if settings.cert else None,
    )


def open_channel(
    address: str, settings: TlsSettings, options: Sequence[tuple[str, Any]]
) -> grpc.Channel:
    """The channel to one server: plaintext, or TLS by `settings`.

    Raises:
      ValueError: TLS options for a Unix socket (its file mode guards it; gRPC has no TLS
        there), or a file that is not PEM of its kind.
      OSError: a file cannot be read.
    """
    if not settings.enabled:
        return grpc.insecure_channel(address, options=list(options))
    if address.startswith("unix"):
        raise ValueError(
            f"{address!r} is a Unix socket, which the server serves without TLS (its file mode "
            f"guards it): drop {settings.options()}, or dial the server's TCP address."
        )
    options = list(options)
    if settings.server_name is not None:
        options.append(("grpc.ssl_target_name_override", settings.server_name))
    return grpc.secure_channel(address, credentials(settings), options=options)


def host_port(address: str) -> tuple[str, int] | None:
    """The TCP host and port a gRPC target dials first (`host:port`, `dns:///host:port`,
    `ipv4:a.b.c.d:port,...`, `ipv6:[::1]:port`); None for Unix sockets and what cannot be
    told."""
    every = _targets(address)
    return every[0] if every else None


def _targets(address: str) -> list[tuple[str, int]]:
    """Every (host, port) of a TCP target (gRPC's `ipv4:`/`ipv6:` lists name several)."""
    if address.startswith("unix"):
        return []
    out = []
    for target in re.sub(r"^(dns:(//[^/]*/)?|ipv4:|ipv6:)", "", address).split(","):
        host, sep, port = target.rpartition(":")
        if not sep or not port.isdigit():
            host, port = target, "443"  # gRPC's default port
        host = host.strip("[]").lower().rstrip(".")
        if host:
            out.append((host, int(port)))
    return out


def refuse_token_in_the_clear(address: str) -> None:
    """Raises ValueError for a token about to go without TLS to a TCP address off loopback: a
    server never serves plaintext there (`serve` refuses it), so whoever answers is not one."""
    for host, _ in _targets(address):
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            loopback = False  # a host name: it may resolve anywhere
        if not loopback:
            raise ValueError(
                f"a token over plaintext to {address!r} would cross the network in the clear "
                f"(the server serves TCP off loopback only with TLS); pass tls_ca=FILE or "
                f"tls=True."
            )
