"""TLS on the server's TCP listeners: which addresses need it, the operator's certificate files
checked before gRPC sees them, and serving them with rotation (re-read when they change).

Rotation: gRPC asks `CertificateFiles.fetch` before every new connection's handshake; it stats
the files (links followed: a Kubernetes Secret volume swaps its `..data` link) and, when one
changed, loads and checks them again. New handshakes then get the new certificate (and client
CA); connections already open, and the streams on them, keep the one they were made with. A
rotation that leaves the files unusable for now (half written, a key not yet matching its
certificate) keeps the previous certificate and logs a warning, once per state of the files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import ssl
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from input_server.serving.listen import Address

log = logging.getLogger(__name__)

# A PEM certificate chain, key or CA bundle is a few KiB; a bigger file is a wrong path.
MAX_PEM_BYTES = 1 << 20
# How often a rotated state of the files that failed to load is tried again.
RETRY_BAD_S = 1.0


def check_exposure(
    addresses: Sequence[Address], *, tls: bool, token_file: str | None, insecure_tcp: bool
) -> None:
    """Refuses a TCP address off loopback (a host IP, a wildcard, a host name) unless it is
    served with TLS and a token: anyone who can reach it could read the data otherwise.

    Raises:
      ValueError: one line naming the address and the flags it needs.
    """
    for a in addresses:
        if a.is_unix or a.loopback:
            continue
        where = f"--listen {a.bind}: a non-loopback address"
        if not tls:
            token = "" if token_file else " (and --token-file FILE)"
            raise ValueError(
                f"{where} needs TLS: pass --tls-cert FILE and --tls-key FILE{token}; "
                f"without them listen on a Unix socket or loopback only."
            )
        if insecure_tcp:
            raise ValueError(
                f"{where} needs a token: --insecure-tcp (no token) is for loopback only; "
                f"drop it and pass --token-file FILE."
            )
        if not token_file:
            raise ValueError(
                f"{where} needs a token as well as TLS: pass --token-file FILE (clients then "
                f"send its token)."
            )


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The PEM bytes of one good state of the files, as gRPC takes them."""

    cert: bytes
    key: bytes = dataclasses.field(repr=False)
    client_ca: bytes | None = None

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], self.client_ca)


def _check_private(st: os.stat_result, flag: str, path: str) -> None:
    """Refuses a private key other users may read, as `--token-file` refuses the token: no
    bits for others, and none for the group of a file that is the server's own. A file owned
    by another user (a Kubernetes Secret: root's, mode 0440, group fsGroup) is read through
    its group, so group read is what lets the server read it at all; group write is not.

    Raises:
      PermissionError: one line naming the file, its mode and the chmod that fixes it.
    """
    mode = stat.S_IMODE(st.st_mode)
    group = mode & 0o070 and (st.st_uid == os.geteuid() or mode & 0o030)
    if mode & 0o007 or group:
        raise PermissionError(
            f"{flag} {path}: has mode {mode:04o}; only the server's user may read the "
            f"private key (chmod 600 {path}; from a Kubernetes Secret volume: defaultMode "
            f"0400, or 0440 with fsGroup for a server that does not run as root)."
        )


def _read(path: str, flag: str, *, private: bool = False) -> bytes:
    """The bytes of the regular file at `path` (a FIFO must fail, not hang the start); with
    `private`, a file others may not read (`_check_private`).

    Raises:
      OSError, ValueError: one line naming the flag and the file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise OSError(f"{flag} {path}: cannot read it ({e.strerror}).") from None
    st = os.fstat(fd)  # the file read, not whatever the path names later
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(f"{flag} {path}: not a regular file.")
    if private:
        try:
            _check_private(st, flag, path)
        except PermissionError:
            os.close(fd)
            raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_PEM_BYTES + 1)
    if len(data) > MAX_PEM_BYTES:
        raise ValueError(f"{flag} {path}: over {MAX_PEM_BYTES >> 20} MiB; not a PEM file.")
    return data


def _reason(e: Exception) -> str:
    """OpenSSL's words without the source location: "no start line", "PEM lib"."""
    text = str(e.args[1] if isinstance(e, ssl.SSLError) and len(e.args) > 1 else e)
    return re.sub(r"^\[\w+\]\s*|\s*\(_ssl\.c:\d+\)$", "", text)


def _check_certificates(data: bytes, flag: str, path: str) -> None:
    """Raises ValueError unless `data` holds PEM certificates that parse."""
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ValueError(f"{flag} {path}: holds no PEM certificate (-----BEGIN CERTIFICATE-----).")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=data.decode("ascii", "replace")
        )
    except (ssl.SSLError, ValueError) as e:
        raise ValueError(f"{flag} {path}: not a valid PEM certificate ({_reason(e)}).") from None


@contextlib.contextmanager
def _as_file(data: bytes) -> Iterator[str]:
    """A path holding `data`, for `ssl`, which loads a key pair only from files: the bytes read
    are the bytes checked (the files may change meanwhile). In memory where Linux allows."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("input-server-tls", 0)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile() as f:  # mode 0600
        f.write(data)
        f.flush()
        yield f.name


def _no_password() -> bytes:
    raise ValueError("encrypted")


def load(cert: str, key: str, client_ca: str | None) -> Loaded:
    """Reads and checks the files: certificates that parse, an unencrypted key that matches
    the certificate, a client CA of certificates.

    Raises:
      OSError, ValueError: one line naming the flag and the file at fault.
    """
    cert_pem = _read(cert, "--tls-cert")
    _check_certificates(cert_pem, "--tls-cert", cert)
    key_pem = _read(key, "--tls-key", private=True)
    if b"ENCRYPTED" in key_pem:
        raise ValueError(
            f"--tls-key {key}: the key is encrypted; gRPC needs it unencrypted (PEM), in a "
            f"file only the server's user can read."
        )
    if b"PRIVATE KEY-----" not in key_pem:
        raise ValueError(
            f"--tls-key {key}: holds no PEM private key (-----BEGIN PRIVATE KEY-----)."
        )
    with _as_file(cert_pem) as cert_path, _as_file(key_pem) as key_path:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
                cert_path, key_path, password=_no_password
            )
        except (ssl.SSLError, ValueError) as e:
            if "KEY_VALUES_MISMATCH" in str(e) or "values mismatch" in str(e):
                raise ValueError(
                    f"--tls-key {key}: does not match the certificate in --tls-cert {cert}."
                ) from None
            raise ValueError(
                f"--tls-key {key}: not a usable PEM private key ({_reason(e)})."
            ) from None
    ca_pem = None
    if client_ca is not None:
        ca_pem = _read(client_ca, "--tls-client-ca")
        _check_certificates(ca_pem, "--tls-client-ca", client_ca)
    return Loaded(cert_pem, key_pem, ca_pem)


class CertificateFiles:
    """The server's certificate, key and client CA files, checked now and re-read when one
    changes (see the module docstring).

    Args:
      cert, key: PEM files: the certificate chain (the server's first) and its private key.
      client_ca: PEM certificates that client certificates must chain to; given, every TLS
        client must present one (mutual TLS).

    Raises:
      OSError, ValueError: a file cannot be read or used (one line naming it).
    """

    def __init__(self, cert: str, key: str, client_ca: str | None = None):
        self.paths = (cert, key, client_ca)
        self._lock = threading.Lock()
        self._seen = self._signature()
        self._bad: tuple | None = None  # the last state that failed to load
        self._retry_at = 0.0
        self.loaded = load(cert, key, client_ca)
        self.reloads = 0  # how many times a changed state of the files was taken up

    def _signature(self) -> tuple:
        """What changes when a file is rewritten or its link swapped (links followed)."""
        out = []
        for path in self.paths:
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            out.append(st and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration when the files changed to a good state, else
        None (keep the current one). Never raises: gRPC calls it from its own threads."""
        try:
            with self._lock:
                signature = self._signature()  # before reading: a change meanwhile is seen next
                if signature == self._seen:
                    return None
                # A state that failed is read again at most once a second, not only at its
                # next change: a file written in place may look the same when complete.
                if signature == self._bad and time.monotonic() < self._retry_at:
                    return None
                try:
                    loaded = load(*self.paths)
                except (OSError, ValueError) as e:
                    if signature != self._bad:  # one warning per broken state
                        log.warning(
                            "TLS files changed, but %s Still serving the previous "
                            "certificate; checked again at new connections.",
                            e,
                        )
                    self._bad, self._retry_at = signature, time.monotonic() + RETRY_BAD_S
                    return None
                self._seen, self._bad = signature, None
                if loaded == self.loaded:
                    return None
                self.loaded = loaded
                self.reloads += 1
                log.info("TLS: new handshakes use the certificate now in %s", self.paths[0])
                return loaded.configuration()
        except Exception:  # noqa: BLE001 - an exception would reach gRPC's C core
            log.exception("TLS: re-reading the certificate files failed")
            return None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that take up rotated files at each new handshake."""
        return grpc.dynamic_ssl_server_credentials(
            self.loaded.configuration(),
            self.fetch,
            require_client_authentication=self.paths[2] is not None,
        )
