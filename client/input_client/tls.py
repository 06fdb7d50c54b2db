"""TLS for the client: its options (`TlsSettings`), the channel they open (`open_channel`), and
what is wrong when a connection cannot be made (`diagnose`).

gRPC reports a failed TLS handshake to a waiting call only as a deadline passing, so a mistake
(plaintext against TLS, an untrusted or expired certificate, a wrong name, a missing client
certificate) would look like a server that never came. `diagnose` repeats the handshake with
Python's `ssl` module, with the same CA, certificate and name, and says what failed in one
line. grpcio and the standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

# The handshake and its answer come within milliseconds on a live server; a server that takes
# longer is slow, not mistaken, and the wait for it goes on.
DIAGNOSIS_TIMEOUT_S = 2.0
# When a call still has no answer after this, the first diagnosis runs; then every
# DIAGNOSIS_EVERY_S while it waits.
FIRST_DIAGNOSIS_S = 0.5
DIAGNOSIS_EVERY_S = 2.0
# What a gRPC client sends first: HTTP/2's preface and an empty SETTINGS frame.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# What OpenSSL says of a server that answers a TLS greeting in another protocol.
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG")
# OpenSSL's verify codes (X509_V_ERR_*) that have a clearer sentence.
_EXPIRED, _NOT_YET_VALID, _HOSTNAME_MISMATCH, _IP_MISMATCH = 10, 9, 62, 64


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


def _reason(e: Exception) -> str:
    """OpenSSL's words without the source location."""
    text = str(e.args[1] if isinstance(e, ssl.SSLError) and len(e.args) > 1 else e)
    return re.sub(r"^\[\w+\]\s*|\s*\(_ssl\.c:\d+\)$", "", text)


def _context(settings: TlsSettings) -> ssl.SSLContext:
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
                f"`tls_ca` {settings.ca}: not a PEM file of CA certificates ({_reason(e)})."
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
                f"certificate and unencrypted key ({_reason(e)})."
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
    """gRPC channel credentials of `settings`, its files checked first (`_context`).

    Raises:
      OSError, ValueError: as `_context`.
    """
    _context(settings)
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
    """The TCP host and port a gRPC target dials (`host:port`, `dns:///host:port`,
    `ipv4:a.b.c.d:port`, `ipv6:[::1]:port`); None for Unix sockets and what cannot be told."""
    if address.startswith("unix"):
        return None
    target = re.sub(r"^(dns:(//[^/]*/)?|ipv4:|ipv6:)", "", address).split(",")[0]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        host, port = target, "443"  # gRPC's default port
    host = host.strip("[]")
    return (host, int(port)) if host else None


def refuse_token_in_the_clear(address: str) -> None:
    """Raises ValueError for a token about to go without TLS to a TCP address off loopback: a
    server never serves plaintext there (`serve` refuses it), so whoever answers is not one."""
    where = host_port(address)
    if where is None or where[0] == "localhost":
        return
    try:
        if ipaddress.ip_address(where[0].split("%")[0]).is_loopback:
            return
    except ValueError:
        pass  # a host name: it may resolve anywhere
    raise ValueError(
        f"a token over plaintext to {address!r} would cross the network in the clear (the "
        f"server serves TCP off loopback only with TLS); pass tls_ca=FILE or tls=True."
    )


def diagnose(
    address: str, settings: TlsSettings, *, timeout_s: float = DIAGNOSIS_TIMEOUT_S
) -> str | None:
    """Why a client with `settings` cannot connect to `address`, in one line, when a TLS
    handshake of its own says so: None when nothing answers yet (refused, unresolvable: a
    server starting), when the handshake succeeds (the trouble is elsewhere), or for a Unix
    socket. Never raises."""
    where = host_port(address)
    if where is None:
        return None
    host, port = where
    server = f"the server at {address!r}"
    try:
        ctx = _context(settings) if settings.enabled else _any_server()
    except (OSError, ValueError) as e:
        return str(e)
    name = settings.server_name or host
    # One deadline for the whole diagnosis: each step gets what is left of it.
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(0.05, deadline - time.monotonic())

    try:
        sock = socket.create_connection((host, port), timeout=left())
    except OSError:
        return None
    try:
        try:
            sock.settimeout(left())
            tls = ctx.wrap_socket(sock, server_hostname=name)
        except ssl.SSLCertVerificationError as e:
            return _untrusted(e, server, settings, address, name, left())
        except ssl.SSLError as e:
            if not settings.enabled:
                return None  # a plaintext client of a server that does not speak TLS: fine
            if e.reason in _NOT_TLS:
                return _plaintext(server, settings)  # an HTTP/2 answer to a TLS greeting
            if isinstance(e, ssl.SSLEOFError):
                return _plaintext(server, settings, closed=True)
            return f"{server}: the TLS handshake failed ({_reason(e)}); check {settings.options()}."
        except OSError:  # a timeout (a slow server), a reset: nothing certain to say
            return None
        if not settings.enabled:
            return (
                f"{server} speaks TLS and this client does not; pass tls_ca=FILE (the CA of its "
                f"certificate) or tls=True (a certificate from a public CA)."
            )
        if time.monotonic() >= deadline:
            return None
        tls.settimeout(left())
        return _after_handshake(tls, server, settings)
    finally:
        sock.close()


def _any_server() -> ssl.SSLContext:
    """A context that completes a handshake with any TLS server: does it speak TLS at all?"""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    return ctx


def _plaintext(server: str, settings: TlsSettings, *, closed: bool = False) -> str:
    said = (
        "closed the connection at the TLS handshake: it may not speak TLS (plaintext)"
        if closed
        else "does not speak TLS (plaintext)"
    )
    return (
        f"{server} {said}; drop {settings.options()}, or start it with "
        f"--tls-cert FILE --tls-key FILE."
    )


def _untrusted(
    e: ssl.SSLCertVerificationError,
    server: str,
    settings: TlsSettings,
    address: str,
    name: str,
    timeout_s: float,
) -> str:
    """The sentence for a server certificate that did not verify."""
    if e.verify_code == _EXPIRED:
        return f"{server}: its certificate has expired; renew it (the server's --tls-cert)."
    if e.verify_code == _NOT_YET_VALID:
        return f"{server}: its certificate is not valid yet (check the clocks)."
    if e.verify_code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
        names = _names(address, settings, timeout_s)
        said = f"for names {names}" if names else "for other names"
        return (
            f"{server}: its certificate is {said}, not {name!r}; pass tls_server_name=NAME "
            f"(one of them), or dial a name it holds."
        )
    roots = f"tls_ca={settings.ca}" if settings.ca else "the default roots (tls=True)"
    hint = "" if settings.ca else "; pass tls_ca=FILE, the CA that signed it"
    return f"{server}: its certificate is not trusted by {roots} ({e.verify_message}){hint}."


def _names(address: str, settings: TlsSettings, timeout_s: float) -> list[str]:
    """The names in the server's (trusted) certificate, from a handshake that checks no name."""
    host, port = host_port(address) or ("", 0)
    try:
        ctx = _context(settings)
        ctx.check_hostname = False
        with (
            socket.create_connection((host, port), timeout=timeout_s) as sock,
            ctx.wrap_socket(sock) as tls,
        ):
            cert = tls.getpeercert() or {}
    except (OSError, ValueError):
        return []
    return [value for _, value in cert.get("subjectAltName", ())]


def _after_handshake(tls: ssl.SSLSocket, server: str, settings: TlsSettings) -> str | None:
    """A server that verifies client certificates refuses one (or none) after the handshake
    in TLS 1.3: it closes the connection, or sends an alert, instead of HTTP/2's SETTINGS."""
    try:
        tls.sendall(_HTTP2_PREFACE)
        answer = tls.recv(9)
    except TimeoutError:
        return None  # slow, not refused
    except ssl.SSLError as e:  # an alert names the reason (OpenSSL servers send one)
        answer, alert = b"", (e.reason or "") if "ALERT" in (e.reason or "") else ""
    except OSError:
        answer, alert = b"", ""
    else:
        alert = ""
    if answer:
        return None
    if settings.cert is None:
        return (
            f"{server} requires a client certificate (mutual TLS); pass tls_cert=FILE and "
            f"tls_key=FILE, signed by a CA the server trusts (its --tls-client-ca)."
        )
    alert = f" ({alert.lower().replace('_', ' ')})" if alert else ""
    return (
        f"{server} refused the client certificate tls_cert={settings.cert}{alert}: it must be "
        f"signed by a CA the server trusts (its --tls-client-ca) and not expired."
    )


def wait_diagnosing(
    future: grpc.Future, diagnose_now: Callable[[float], str | None], timeout_s: float
) -> Any:
    """`future.result()` (a call with a deadline of `timeout_s` from now), asking
    `diagnose_now(timeout_s)` while no answer has come (after FIRST_DIAGNOSIS_S, then every
    DIAGNOSIS_EVERY_S), never past the call's own deadline.

    Raises:
      ConnectionError: the first problem `diagnose_now` finds (the call is cancelled).
      grpc.RpcError: the call's failure, as `result()` raises it.
    """
    deadline = time.monotonic() + timeout_s
    wait = FIRST_DIAGNOSIS_S
    try:
        while True:
            try:
                return future.result(timeout=wait)
            except grpc.FutureTimeoutError:
                pass
            left = deadline - time.monotonic()
            problem = diagnose_now(min(DIAGNOSIS_TIMEOUT_S, left)) if left > 0.1 else None
            if problem:
                raise ConnectionError(problem)
            wait = DIAGNOSIS_EVERY_S
    finally:
        future.cancel()  # answered: nothing to cancel; else (a problem, Ctrl-C) no call left
