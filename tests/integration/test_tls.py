"""TLS on the wire: TCP with TLS (and mutual TLS) streams the same batches as plaintext; every
mistake is one line at once, not a wait for the connect timeout; the start-up refusals; a
non-loopback listener; the plaintext health port; certificate rotation; the token never shown.

Certificates are made at test time (trustme), one CA for the server and clients, another that
nobody trusts.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import os
import socket
import threading
import time

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from input_client import InputClient, ReconnectError, StreamError
from input_client.proto import pb, pb_grpc
from input_server import cli
from input_server.serving import auth
from input_server.serving.server import Server, ServerConfig
from tests.support import (
    TOKENS,
    assert_one_line,
    assert_same_batches,
    free_port,
    health,
    run_main,
    run_pipeline,
    serve_cli,
    write_token_file,
)

NAMES = ("input-server.test", "localhost", "127.0.0.1", "::1")
PAST = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
# A mistake must be said well before the connect timeout a caller gave.
CONNECT_TIMEOUT_S = 20
AT_ONCE_S = 5.0
BATCHES = 12  # enough to compare a stream, few enough to stay fast


@dataclasses.dataclass(frozen=True)
class Pair:
    cert: str
    key: str


@dataclasses.dataclass(frozen=True)
class Pki:
    """PEM files: `ca` signs `server`, `expired` and `client`; `other_ca` signs `stranger`."""

    ca: str
    other_ca: str
    server: Pair
    expired: Pair
    client: Pair
    stranger: Pair
    other_server: Pair  # for "rotated.test", signed by `other_ca`
    token_file: str
    token: str


def write_pair(leaf: trustme.LeafCert, folder, stem: str) -> Pair:
    cert, key = os.path.join(folder, f"{stem}.crt"), os.path.join(folder, f"{stem}.key")
    leaf.cert_chain_pems[0].write_to_path(cert)
    for pem in leaf.cert_chain_pems[1:]:
        pem.write_to_path(cert, append=True)
    leaf.private_key_pem.write_to_path(key)
    os.chmod(key, 0o600)
    return Pair(cert, key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    other.cert_pem.write_to_path(str(folder / "other-ca.pem"))
    token_file, token = write_token_file(folder)
    return Pki(
        ca=str(folder / "ca.pem"),
        other_ca=str(folder / "other-ca.pem"),
        server=write_pair(ca.issue_cert(*NAMES), folder, "server"),
        expired=write_pair(
            ca.issue_cert(*NAMES, not_before=PAST - datetime.timedelta(days=30), not_after=PAST),
            folder,
            "expired",
        ),
        client=write_pair(ca.issue_cert("trainer-0"), folder, "client"),
        stranger=write_pair(other.issue_cert("trainer-0"), folder, "stranger"),
        other_server=write_pair(other.issue_cert("rotated.test"), folder, "other-server"),
        token_file=token_file,
        token=token,
    )


def tls_config(pki: Pki, *, pair: Pair | None = None, mutual: bool = False, **more) -> ServerConfig:
    pair = pair or pki.server
    return ServerConfig(
        listen=more.pop("listen", ["127.0.0.1:0"]),
        token_file=pki.token_file,
        tls_cert=pair.cert,
        tls_key=pair.key,
        tls_client_ca=pki.ca if mutual else None,
        **more,
    )


@pytest.fixture(scope="module")
def tls_server(pki):
    with Server(tls_config(pki)) as srv:
        yield srv


@pytest.fixture(scope="module")
def mtls_server(pki):
    with Server(tls_config(pki, mutual=True)) as srv:
        yield srv


def take(client: InputClient, spec, n: int = BATCHES) -> list:
    with client.batches(spec) as it:
        return list(itertools.islice(it, n))


# --- Serving over TLS ----------------------------------------------------------------------------


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_batches_over_tls_are_those_of_a_plaintext_server(
    pki, tls_server, mtls_server, server, make_spec, mutual
):
    spec = make_spec()
    srv = mtls_server if mutual else tls_server
    cert = {"tls_cert": pki.client.cert, "tls_key": pki.client.key} if mutual else {}
    with InputClient(
        srv.targets[0], connect_timeout_s=10, token=pki.token, tls_ca=pki.ca, **cert
    ) as c:
        got = take(c, spec)
    plain = server.targets[1]  # the session server's loopback TCP, plaintext
    with InputClient(plain, connect_timeout_s=10, token=TOKENS[plain]) as c:
        want = take(c, spec)
    assert len(got) == BATCHES
    assert_same_batches(got, want)
    assert_same_batches(got, run_pipeline(spec, limit=BATCHES))


def test_a_unix_socket_beside_tls_stays_plaintext(pki, tmp_path):
    sock = f"unix://{tmp_path}/s.sock"
    with Server(tls_config(pki, listen=[sock, "127.0.0.1:0"])) as srv:
        with InputClient(sock, connect_timeout_s=10) as c:  # its file mode guards it
            assert c.info().server_version
        with InputClient(srv.targets[1], connect_timeout_s=10, token=pki.token, tls_ca=pki.ca) as c:
            assert c.info().server_version


# --- Mistakes: one line, at once -----------------------------------------------------------------


def connect_mistake(target: str, **options) -> str:
    """The ConnectionError of `wait_ready()` against `target`, which must come at once."""
    start = time.monotonic()
    with (
        InputClient(target, connect_timeout_s=CONNECT_TIMEOUT_S, **options) as c,
        pytest.raises(ConnectionError) as e,
    ):
        c.wait_ready()
    took = time.monotonic() - start
    assert took < AT_ONCE_S, f"{took:.1f} s: waited instead of saying {e.value}"
    message = str(e.value)
    assert "\n" not in message and f"{target!r}" in message, message
    return message


def test_a_plaintext_client_of_a_tls_server_is_told_to_use_tls(pki, tls_server):
    message = connect_mistake(tls_server.targets[0], token=pki.token)
    assert "speaks TLS" in message and "tls_ca=FILE" in message and "tls=True" in message


def test_a_tls_client_of_a_plaintext_server_is_told_it_is_plaintext(pki, server):
    message = connect_mistake(server.targets[1], token=TOKENS[server.targets[1]], tls_ca=pki.ca)
    assert "does not speak TLS (plaintext)" in message and "--tls-cert" in message


@pytest.mark.parametrize("roots", ["other-ca", "default-roots"])
def test_a_certificate_from_an_untrusted_ca_is_named_as_such(pki, tls_server, roots):
    options = {"tls_ca": pki.other_ca} if roots == "other-ca" else {"tls": True}
    message = connect_mistake(tls_server.targets[0], token=pki.token, **options)
    assert "not trusted by" in message and "unable to get local issuer certificate" in message
    assert (pki.other_ca in message) if roots == "other-ca" else ("tls_ca=FILE" in message)


def test_an_expired_server_certificate_is_named_as_such(pki):
    with Server(tls_config(pki, pair=pki.expired)) as srv:
        message = connect_mistake(srv.targets[0], token=pki.token, tls_ca=pki.ca)
    assert "certificate has expired" in message


def test_a_name_the_certificate_lacks_is_named_with_the_names_it_has(pki, tls_server):
    message = connect_mistake(
        tls_server.targets[0], token=pki.token, tls_ca=pki.ca, tls_server_name="other.test"
    )
    assert "'other.test'" in message and "tls_server_name=" in message
    assert "input-server.test" in message  # the names it does hold


def test_mutual_tls_without_a_client_certificate_asks_for_one(pki, mtls_server):
    message = connect_mistake(mtls_server.targets[0], token=pki.token, tls_ca=pki.ca)
    assert "requires a client certificate" in message
    assert "tls_cert=" in message and "tls_key=" in message


def test_mutual_tls_refuses_a_client_certificate_of_an_untrusted_ca(pki, mtls_server):
    message = connect_mistake(
        mtls_server.targets[0],
        token=pki.token,
        tls_ca=pki.ca,
        tls_cert=pki.stranger.cert,
        tls_key=pki.stranger.key,
    )
    assert "refused the client certificate" in message and pki.stranger.cert in message


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["no-token", "wrong-token"])
def test_over_tls_a_missing_or_wrong_token_is_unauthenticated_at_once(pki, tls_server, token):
    start = time.monotonic()
    with (
        InputClient(
            tls_server.targets[0], connect_timeout_s=CONNECT_TIMEOUT_S, token=token, tls_ca=pki.ca
        ) as c,
        pytest.raises(StreamError) as e,
    ):
        c.wait_ready()
    assert time.monotonic() - start < AT_ONCE_S
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert e.value.details == auth.UNAUTHENTICATED and "token_file=" in e.value.details


def test_nothing_listening_yet_is_still_waited_for(pki):
    start = time.monotonic()
    with (
        InputClient(f"127.0.0.1:{free_port()}", connect_timeout_s=1.5, tls_ca=pki.ca) as c,
        pytest.raises(ConnectionError, match="no input server reachable"),
    ):
        c.wait_ready()
    assert time.monotonic() - start >= 1.4


def test_a_plaintext_client_that_dials_before_a_plaintext_server_starts_waits_for_it(
    tmp_path, make_spec
):
    # Its diagnosis must not take the plaintext server's refusal of a TLS probe for a mistake.
    address = f"127.0.0.1:{free_port()}"
    servers = []
    late = threading.Timer(
        1.5,
        lambda: servers.append(Server(ServerConfig(listen=[address], insecure_tcp=True))),
    )
    try:
        with InputClient(address, connect_timeout_s=20) as c:
            late.start()
            c.wait_ready()
            assert next(c.batches(make_spec()))["inputs"].size
    finally:
        late.join()
        for srv in servers:
            srv.stop(0)


def test_a_live_plaintext_server_is_no_mistake_for_a_plaintext_client(pki):
    from input_client.tls import TlsSettings
    from input_client.tls_diagnosis import diagnose

    with Server(ServerConfig(listen=["127.0.0.1:0"], insecure_tcp=True)) as srv:
        target = srv.targets[0]
        assert diagnose(target, TlsSettings()) is None
        said = diagnose(target, TlsSettings.of(tls_ca=pki.ca))
        assert said is not None and "does not speak TLS" in said


def test_a_token_is_never_sent_in_the_clear_off_loopback():
    for address in (
        "10.1.2.3:50051",
        "pool-0.pool.ns.svc:50051",
        "dns:///example.com:443",
        "ipv4:127.0.0.1:1,10.0.0.9:1",  # every address of gRPC's list counts
    ):
        with pytest.raises(ValueError, match="in the clear"):
            InputClient(address, token="secret-token")
    for address in ("127.0.0.1:1", "Localhost:1", "[::1]:1", "ipv6:[::1]:1", "unix:///tmp/x.sock"):
        InputClient(address, token="secret-token").close()


def test_info_takes_the_tls_options_and_says_a_mistake_in_one_line(capsys, pki, mtls_server):
    target = mtls_server.targets[0]
    base = ["info", target, "--token-file", pki.token_file, "--timeout-s", "20"]
    code = cli.main(
        [
            *base,
            "--tls-ca",
            pki.ca,
            "--tls-cert",
            pki.client.cert,
            "--tls-key",
            pki.client.key,
            "--json",
        ]
    )
    assert code == 0 and '"serverVersion"' in capsys.readouterr().out
    start = time.monotonic()
    code, err = run_main(capsys, *base, "--tls-ca", pki.ca)
    assert time.monotonic() - start < AT_ONCE_S
    assert_one_line(code, err, "requires a client certificate")
    code, err = run_main(capsys, *base, "--tls-cert", pki.client.cert)
    assert_one_line(code, err, "tls_cert", "tls_key")


# --- Refusals at start: one line, exit 2 ----------------------------------------------------------


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "192.0.2.7:50051", "example.com:0"])
def test_a_non_loopback_address_without_tls_is_refused(capsys, listen, pki):
    code, err = run_main(capsys, "serve", "--listen", listen, "--insecure-tcp")
    assert_one_line(code, err, listen, "needs TLS", "--tls-cert", "--tls-key", "--token-file")
    code, err = run_main(capsys, "serve", "--listen", listen, "--token-file", pki.token_file)
    assert_one_line(code, err, listen, "needs TLS", "--tls-cert")


def test_a_non_loopback_address_needs_a_token_too_and_insecure_tcp_does_not_do(capsys, pki):
    tls = ["--tls-cert", pki.server.cert, "--tls-key", pki.server.key]
    code, err = run_main(capsys, "serve", "--listen", "0.0.0.0:0", *tls)
    assert_one_line(code, err, "0.0.0.0:0", "--token-file")
    code, err = run_main(capsys, "serve", "--listen", "0.0.0.0:0", *tls, "--insecure-tcp")
    assert_one_line(code, err, "0.0.0.0:0", "--insecure-tcp", "loopback only", "--token-file")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--tls-client-ca", "CA"], ["--tls-client-ca", "--tls-cert", "--tls-key"]),
        (["--tls-cert", "CERT"], ["--tls-cert", "--tls-key"]),
        (["--tls-key", "KEY"], ["--tls-key", "--tls-cert"]),
        (["--tls-cert", "CERT", "--tls-key", "OTHER_KEY"], ["OTHER_KEY", "does not match", "CERT"]),
        (["--tls-cert", "CERT", "--tls-key", "MISSING"], ["MISSING", "cannot read"]),
        (["--tls-cert", "KEY", "--tls-key", "KEY"], ["--tls-cert", "KEY", "no PEM certificate"]),
        (["--tls-cert", "CERT", "--tls-key", "HALF"], ["--tls-key", "HALF"]),
        (["--tls-cert", "CERT", "--tls-key", "KEY", "--tls-client-ca", "KEY"], ["--tls-client-ca"]),
        (["--health-port", "70000"], ["--health-port", "70000"]),
    ],
    ids=[
        "client-ca-alone",
        "cert-alone",
        "key-alone",
        "key-of-another-cert",
        "missing-key",
        "key-as-cert",
        "half-written-key",
        "key-as-client-ca",
        "health-port-range",
    ],
)
def test_serve_refuses_tls_flags_that_cannot_work(capsys, tmp_path, pki, flags, words):
    half = tmp_path / "half.key"
    half.touch(0o600)
    half.write_bytes(open(pki.server.key, "rb").read()[:60])
    files = {
        "CA": pki.ca,
        "CERT": pki.server.cert,
        "KEY": pki.server.key,
        "OTHER_KEY": pki.client.key,
        "MISSING": str(tmp_path / "missing.key"),
        "HALF": str(half),
    }
    argv = [files.get(f, f) for f in flags]
    code, err = run_main(
        capsys, "serve", "--listen", "127.0.0.1:0", "--token-file", pki.token_file, *argv
    )
    assert_one_line(code, err, *(files.get(w, w) for w in words))


def test_a_non_loopback_listener_serves_with_tls_and_the_token(pki, make_spec):
    with Server(tls_config(pki, listen=["0.0.0.0:0"])) as srv:
        port = srv.targets[0].rsplit(":", 1)[1]
        options = {"tls_ca": pki.ca, "tls_server_name": "input-server.test"}
        with InputClient(
            f"127.0.0.1:{port}", connect_timeout_s=10, token=pki.token, **options
        ) as c:
            assert len(take(c, make_spec(), 3)) == 3
        with InputClient(f"127.0.0.1:{port}", connect_timeout_s=10, **options) as c:
            with pytest.raises(StreamError) as e:
                c.info()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


# --- The health port ------------------------------------------------------------------------------


def test_the_health_port_answers_plaintext_beside_mutual_tls_and_nothing_else(pki, make_spec):
    with Server(tls_config(pki, mutual=True, health_port=0, grace_s=3)) as srv:
        probe = f"127.0.0.1:{srv.health_port}"
        for service in ("", "input_server.v1.InputService"):
            assert health(probe, service) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError):  # the main port speaks only mutual TLS
            health(srv.targets[0])
        with grpc.insecure_channel(probe) as channel:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.InputServiceStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # A drain says NOT_SERVING here too: a watcher hears it as the drain begins.
        options = {"tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key}
        with (
            InputClient(srv.targets[0], connect_timeout_s=10, token=pki.token, **options) as c,
            c.batches(make_spec(order={"epochs": 0}), reconnect_deadline_s=0, prefetch=1) as it,
            grpc.insecure_channel(probe) as channel,
        ):
            next(it)
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=30
            )
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            stopper = threading.Thread(target=srv.stop)
            stopper.start()
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            stopper.join()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):  # stopped with it
        s.connect(("127.0.0.1", srv.health_port))


def test_a_health_port_in_use_refuses_the_start(capsys, pki):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run_main(
            capsys,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            pki.token_file,
            "--health-port",
            str(port),
        )
    assert_one_line(code, err, f"--health-port {port}", "cannot bind")


# --- Rotation -------------------------------------------------------------------------------------


def secret_version(secret, name: str, pair: Pair | None, *, key_bytes: bytes | None = None) -> None:
    """Writes `..NAME/tls.crt` and `tls.key` into the Secret-like folder and points `..data` at
    it in one rename, as the kubelet updates a Secret volume."""
    version = secret / f"..{name}"
    version.mkdir()
    (version / "tls.crt").write_bytes(open(pair.cert, "rb").read())
    (version / "tls.key").touch(0o600)  # the server refuses a key others may read
    (version / "tls.key").write_bytes(key_bytes or open(pair.key, "rb").read())
    link = secret / "..data_tmp"
    os.symlink(version.name, link)
    os.replace(link, secret / "..data")


def test_rotated_certificates_reach_new_handshakes_while_open_streams_go_on(
    pki, tmp_path, make_spec, caplog
):
    secret = tmp_path / "secret"
    secret.mkdir()
    secret_version(secret, "v1", pki.server)
    for name in ("tls.crt", "tls.key"):
        os.symlink(f"..data/{name}", secret / name)
    spec = make_spec()
    want = run_pipeline(spec, limit=3 * BATCHES)
    config = ServerConfig(
        listen=["127.0.0.1:0"],
        token_file=pki.token_file,
        tls_cert=str(secret / "tls.crt"),
        tls_key=str(secret / "tls.key"),
    )
    new = {"tls_ca": pki.other_ca, "tls_server_name": "rotated.test", "token": pki.token}
    with Server(config) as srv:
        target = srv.targets[0]
        with (
            InputClient(target, connect_timeout_s=10, token=pki.token, tls_ca=pki.ca) as old,
            old.batches(spec, prefetch=1) as it,
        ):
            got = list(itertools.islice(it, BATCHES))
            # To another CA and name: new handshakes get it, the open stream keeps going.
            secret_version(secret, "v2", pki.other_server)
            with InputClient(target, connect_timeout_s=10, **new) as c:
                assert c.info().server_version
            assert "not trusted" in connect_mistake(target, token=pki.token, tls_ca=pki.ca)
            got += list(itertools.islice(it, BATCHES))
            # A broken rotation (a key cut short, as if half-written) keeps the last good one.
            with caplog.at_level(logging.WARNING, logger="input_server.serving.tls"):
                secret_version(secret, "v3", pki.server, key_bytes=b"-----BEGIN PRIVATE KEY-----")
                with InputClient(target, connect_timeout_s=10, **new) as c:
                    assert c.info().server_version
            assert "Still serving the previous certificate" in caplog.text
            assert srv.certificates.reloads == 1
            got += list(itertools.islice(it, BATCHES))
            assert it.reconnects == 0
    assert_same_batches(got, want)


def test_a_file_rewritten_in_place_that_looks_unchanged_is_taken_up_once_complete(pki, tmp_path):
    # A writer that fills a file in place (same inode, same length) may leave the same stat
    # signature for the broken and the complete state: the broken one is retried, not kept.
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(open(pki.server.cert, "rb").read())
    key.touch(0o600)
    key.write_bytes(open(pki.server.key, "rb").read())
    with Server(tls_config(pki, pair=Pair(str(cert), str(key)))) as srv:
        target = srv.targets[0]
        options = {"token": pki.token, "tls_ca": pki.other_ca, "tls_server_name": "rotated.test"}
        new_cert, new_key = (
            open(p, "rb").read() for p in (pki.other_server.cert, pki.other_server.key)
        )
        cert.write_bytes(new_cert)
        with open(key, "wb") as f:  # the new key cut short, padded to its length
            f.write(new_key[: len(new_key) // 2].ljust(len(new_key), b"\0"))
        assert "not trusted" in connect_mistake(target, token=pki.token, tls_ca=pki.other_ca)
        st = os.stat(key)
        with open(key, "r+b") as f:  # now complete, in place: same inode, size and mtime
            f.write(new_key)
        os.utime(key, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(key).st_mtime_ns == st.st_mtime_ns and os.stat(key).st_size == st.st_size
        time.sleep(1.2)  # the broken state's retry interval
        with InputClient(target, connect_timeout_s=10, **options) as c:
            assert c.info().server_version
        assert srv.certificates.reloads == 1


def test_a_server_restarted_with_an_untrusted_certificate_ends_the_outage_with_why(pki, make_spec):
    address = f"127.0.0.1:{free_port()}"
    first = Server(tls_config(pki, listen=[address], grace_s=1))
    replacement = None
    try:
        with (
            InputClient(address, connect_timeout_s=10, token=pki.token, tls_ca=pki.ca) as c,
            c.batches(make_spec(order={"epochs": 0}), prefetch=1, reconnect_deadline_s=4) as it,
        ):
            next(it)
            first.stop()
            replacement = Server(tls_config(pki, pair=pki.other_server, listen=[address]))
            with pytest.raises(ReconnectError) as e:
                for _ in range(100_000):
                    next(it)
    finally:
        first.stop(0)
        if replacement is not None:
            replacement.stop(0)
    assert "not trusted by" in str(e.value) and pki.ca in str(e.value)


# --- The token stays secret -----------------------------------------------------------------------


def test_the_token_appears_in_no_log_error_repr_or_info_output(pki, tls_server, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    target = tls_server.targets[0]
    said = []
    with InputClient(target, connect_timeout_s=5, token=pki.token, tls_ca=pki.ca) as c:
        said += [repr(c), str(vars(c))]
        assert c.info().server_version
    for options in ({}, {"tls_ca": pki.other_ca}, {"tls_ca": pki.ca, "tls_server_name": "x.test"}):
        with InputClient(target, connect_timeout_s=5, token=pki.token, **options) as c:
            with pytest.raises(ConnectionError) as e:
                c.wait_ready()
            said.append(str(e.value))
    wrong = pki.token[::-1]
    with InputClient(target, connect_timeout_s=5, token=wrong, tls_ca=pki.ca) as c:
        with pytest.raises(StreamError) as e:
            c.wait_ready()
        said.append(str(e.value))
    argv = ["-v", "info", target, "--token-file", pki.token_file, "--tls-ca", pki.ca]
    assert cli.main(argv) == 0
    assert cli.main([*argv[:-1], pki.other_ca]) == 2
    out = capsys.readouterr()
    said += [out.out, out.err, caplog.text]
    for text in said:
        assert pki.token not in text and wrong not in text


# --- What peers without credentials leave behind ------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o640, 0o660])
def test_serve_refuses_a_tls_key_others_may_read(tmp_path, pki, mode):
    key = tmp_path / "server.key"
    key.write_bytes(open(pki.server.key, "rb").read())
    key.chmod(mode)
    # Not started: built in full, a key accepted would leave a server that never returns.
    with pytest.raises(PermissionError) as e:
        Server(tls_config(pki, pair=Pair(pki.server.cert, str(key))), start=False)
    for words in ("--tls-key", str(key), f"{mode:04o}", f"chmod 600 {key}"):
        assert words in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_key_of_another_user_read_through_its_group_is_served(tmp_path, pki):
    """A Kubernetes Secret as kubelet writes it with fsGroup: root's, 0440, the server's group
    (deploy/k8s/pool.yaml): the group is how the server reads it at all."""
    key = tmp_path / "tls.key"
    key.write_bytes(open(pki.server.key, "rb").read())
    os.chown(key, 65534, os.getegid())
    key.chmod(0o440)
    with Server(tls_config(pki, pair=Pair(pki.server.cert, str(key)))) as srv:
        assert srv.certificates is not None and srv.targets


def test_failed_handshakes_leave_the_servers_log_bounded(tmp_path, pki):
    """Each failed TLS handshake made gRPC's core log a line: 50 peers speaking plaintext
    HTTP at the TLS port grew the log by 50 lines, without limit."""
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    child, targets = serve_cli(
        "--listen", "127.0.0.1:0", "--token-file", pki.token_file,
        "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
        log=str(log), env=env,
    )  # fmt: skip
    try:
        host, port = targets[0].rsplit(":", 1)
        before = log.stat().st_size
        for _ in range(50):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                try:
                    s.recv(100)
                except OSError:
                    pass
        with InputClient(targets[0], token=pki.token, tls_ca=pki.ca) as c:
            assert c.info().server_version  # every handshake seen and done with
        child.p.terminate()  # a clean exit: nothing the process buffered is lost
        child.p.wait(timeout=30)
    finally:
        child.kill()
    grown = log.read_text()[before:]
    assert len(grown) < 1000, f"the log grew by {len(grown)} bytes: {grown[:500]}"
