"""What is wrong when a connection cannot be made, said in one line (`diagnose`).

gRPC reports a failed TLS handshake to a waiting call only as a deadline passing, so a mistake
(plaintext against TLS, an untrusted or expired certificate, a wrong name, a missing client
certificate) would look like a server that never came. `diagnose` repeats the handshake with
Python's `ssl` module, with the same CA, certificate and name (`tls.verifying_context`), and
says what failed. grpcio and the standard library only.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from input_client.tls import TlsSettings, host_port, ssl_reason, verifying_context

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


class Unreachable(OSError):
    """Why no TCP connection could be made, in words ("nothing listens at HOST:PORT
    (connection refused)", "cannot resolve host 'x' (Name or service not known)"); `final`
    when the name lookup says the name does not exist (no server starting changes that)."""

    def __init__(self, words: str, *, final: bool = False):
        super().__init__(words)
        self.words = words
        self.final = final


# getaddrinfo's answers that say the name does not exist, as against a lookup that failed
# for now (EAI_AGAIN: no DNS server answered).
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def diagnose(
    address: str,
    settings: TlsSettings,
    *,
    timeout_s: float = DIAGNOSIS_TIMEOUT_S,
    on_unreachable: Callable[[Unreachable], None] | None = None,
) -> str | None:
    """Why a client with `settings` cannot connect to `address`, in one line, when a TLS
    handshake of its own says so: None when nothing answers yet (refused, unresolvable: a
    server starting; `on_unreachable` is told why), when the handshake succeeds (the trouble
    is elsewhere), or for a Unix socket. Never raises."""
    where = host_port(address)
    if where is None:
        return None
    host, port = where
    server = f"the server at {address!r}"
    try:
        ctx = verifying_context(settings) if settings.enabled else _any_server()
    except (OSError, ValueError) as e:
        return str(e)
    name = settings.server_name or host
    # One deadline for the whole diagnosis: each step gets what is left of it.
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(0.05, deadline - time.monotonic())

    try:
        sock = _connect(host, port, left())
    except Unreachable as e:  # refused, unresolvable
        if on_unreachable is not None:
            on_unreachable(e)
        return None
    except (OSError, ValueError):
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
            why = ssl_reason(e)
            return f"{server}: the TLS handshake failed ({why}); check {settings.options()}."
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


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection to the first address `host` resolves to, name lookup included within
    `timeout_s` (getaddrinfo takes no timeout: it runs on a thread not waited for past it; its
    failure is handed back, never left to the thread to print).

    Raises:
      Unreachable: unresolved (in time), refused, unreachable; saying which.
    """
    found: list = []
    failed: list[BaseException] = []

    def lookup_now() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as e:  # a label too long is a UnicodeError
            failed.append(e)

    lookup = threading.Thread(target=lookup_now, name="input-client-lookup", daemon=True)
    start = time.monotonic()
    lookup.start()
    lookup.join(timeout_s)
    if failed:
        e = failed[0]
        final = isinstance(e, UnicodeError) or (
            isinstance(e, socket.gaierror) and e.errno in _NO_SUCH_NAME
        )
        why = getattr(e, "strerror", None) or str(e)
        raise Unreachable(f"cannot resolve host {host!r} ({why})", final=final)
    if not found or not found[0]:
        raise Unreachable(f"cannot resolve host {host!r} within {timeout_s:g} s")
    family, kind, proto, _, where = found[0][0]
    sock = socket.socket(family, kind, proto)
    sock.settimeout(max(0.05, timeout_s - (time.monotonic() - start)))
    at = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        sock.connect(where)
    except ConnectionRefusedError:
        sock.close()
        raise Unreachable(f"nothing listens at {at} (connection refused)") from None
    except OSError as e:
        sock.close()
        raise Unreachable(f"cannot connect to {at} ({e.strerror or e})") from None
    except BaseException:
        sock.close()
        raise
    return sock


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
        ctx = verifying_context(settings)
        ctx.check_hostname = False
        with _connect(host, port, timeout_s) as sock, ctx.wrap_socket(sock) as tls:
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
