"""The TLS options on their own: the client's `TlsSettings` and what an address says, the
server's checks of its flags and files (`ServerConfig`, `tls.check_exposure`, `tls.load`), and
rotation's fetcher against files changed in place. No server runs here
(tests/integration/test_tls.py has them)."""

from __future__ import annotations

import logging
import os

import pytest
import trustme

from input_client import InputClient, tls_diagnosis
from input_client import tls as client_tls
from input_client.tls import TlsSettings
from input_server.serving import tls
from input_server.serving.listen import parse_address
from input_server.serving.server import ServerConfig


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("pem")
    ca = trustme.CA()
    out = {"ca": str(folder / "ca.pem")}
    ca.cert_pem.write_to_path(out["ca"])
    for stem, leaf in (("server", ca.issue_cert("localhost")), ("other", ca.issue_cert("x"))):
        out[stem] = str(folder / f"{stem}.crt")
        out[f"{stem}_key"] = str(folder / f"{stem}.key")
        leaf.cert_chain_pems[0].write_to_path(out[stem])
        leaf.private_key_pem.write_to_path(out[f"{stem}_key"])
    return out


# --- The client's options -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, enabled",
    [
        ({}, False),
        ({"tls": True}, True),
        ({"tls_ca": "ca.pem"}, True),
        ({"tls_server_name": "x.test"}, True),
        ({"tls_cert": "c.pem", "tls_key": "k.pem"}, True),
    ],
)
def test_any_tls_option_implies_tls(options, enabled):
    assert TlsSettings.of(**options).enabled is enabled


@pytest.mark.parametrize("given", [{"tls_cert": "c.pem"}, {"tls_key": "k.pem"}])
def test_a_client_certificate_needs_its_key_and_the_reverse(given):
    with pytest.raises(ValueError, match="both `tls_cert` and `tls_key`"):
        InputClient("127.0.0.1:1", **given)


@pytest.mark.parametrize("address", ["unix:///tmp/x.sock", "unix-abstract:input"])
def test_tls_options_on_a_unix_socket_are_refused(address, files):
    with pytest.raises(ValueError, match="Unix socket") as e:
        InputClient(address, tls_ca=files["ca"])
    assert "tls_ca=" in str(e.value)


def test_missing_or_wrong_client_files_are_named(tmp_path, files):
    with pytest.raises(OSError, match="tls_ca.*missing.pem"):
        InputClient("127.0.0.1:1", tls_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="not a PEM file of CA certificates"):
        InputClient("127.0.0.1:1", tls_ca=files["server_key"])
    with pytest.raises(ValueError, match="does not match"):
        InputClient("127.0.0.1:1", tls_cert=files["server"], tls_key=files["other_key"])


def test_settings_show_paths_never_contents(files):
    settings = TlsSettings.of(
        tls_ca=files["ca"], tls_cert=files["server"], tls_key=files["server_key"]
    )
    key = open(files["server_key"]).read().splitlines()[1]
    assert key not in repr(settings) and files["server_key"] in settings.options()


@pytest.mark.parametrize(
    "address, want",
    [
        ("127.0.0.1:50051", ("127.0.0.1", 50051)),
        ("[::1]:8443", ("::1", 8443)),
        ("dns:///input.example:443", ("input.example", 443)),
        ("ipv4:10.0.0.1:7", ("10.0.0.1", 7)),
        ("ipv6:[::1]:7", ("::1", 7)),
        ("input.example", ("input.example", 443)),
        ("unix:///tmp/x.sock", None),
        ("unix-abstract:x", None),
    ],
)
def test_host_port_is_what_grpc_dials(address, want):
    assert client_tls.host_port(address) == want


def test_nothing_listening_is_no_diagnosis():
    from tests.support import free_port

    assert tls_diagnosis.diagnose(f"127.0.0.1:{free_port()}", TlsSettings(enabled=True)) is None
    assert tls_diagnosis.diagnose("unix:///tmp/nothing.sock", TlsSettings()) is None


# --- The server's flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"tls_client_ca": "ca.pem"}, ["--tls-client-ca", "--tls-cert"]),
        ({"tls_cert": "c.pem"}, ["--tls-cert needs --tls-key"]),
        ({"tls_key": "k.pem"}, ["--tls-key needs --tls-cert"]),
        ({"tls_cert": ""}, ["--tls-cert: empty path"]),
        ({"health_port": -1}, ["--health-port -1"]),
    ],
)
def test_server_config_refuses_tls_flags_that_cannot_work(fields, words):
    with pytest.raises(ValueError) as e:
        ServerConfig(**fields)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize(
    "tls_on, token, insecure, words",
    [
        (False, None, False, ["needs TLS", "--tls-cert", "--token-file"]),
        (False, "t", False, ["needs TLS", "--tls-key"]),
        (True, None, False, ["needs a token", "--token-file"]),
        (True, None, True, ["--insecure-tcp", "loopback only"]),
        (True, "t", True, ["--insecure-tcp"]),
    ],
)
def test_off_loopback_needs_tls_and_a_token(tls_on, token, insecure, words):
    with pytest.raises(ValueError) as e:
        tls.check_exposure(
            [parse_address("10.1.2.3:5000")], tls=tls_on, token_file=token, insecure_tcp=insecure
        )
    assert str(e.value).startswith("--listen 10.1.2.3:5000: a non-loopback address")
    for w in words:
        assert w in str(e.value)


def test_loopback_and_unix_need_no_tls():
    addresses = [parse_address(a) for a in ("127.0.0.1:0", "[::1]:0", "unix:/tmp/s.sock")]
    tls.check_exposure(addresses, tls=False, token_file=None, insecure_tcp=True)
    tls.check_exposure(
        [parse_address("0.0.0.0:0")], tls=True, token_file="token", insecure_tcp=False
    )


# --- Rotation's fetcher ---------------------------------------------------------------------------


def test_the_fetcher_takes_up_good_changes_and_keeps_the_last_good_state(tmp_path, files, caplog):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    key.touch(0o600)  # the server refuses a key others may read
    cert.write_bytes(open(files["server"], "rb").read())
    key.write_bytes(open(files["server_key"], "rb").read())
    watched = tls.CertificateFiles(str(cert), str(key))
    first = watched.loaded
    assert watched.fetch() is None  # unchanged: nothing re-read
    # Half a rotation: the certificate is new, its key not yet.
    cert.write_bytes(open(files["other"], "rb").read())
    with caplog.at_level(logging.WARNING, logger="input_server.serving.tls"):
        assert watched.fetch() is None
        assert watched.fetch() is None  # the same broken state: warned once
    assert caplog.text.count("Still serving the previous certificate") == 1
    assert "does not match" in caplog.text
    assert watched.loaded is first
    key.write_bytes(open(files["other_key"], "rb").read())
    os.utime(key, ns=(1, 1))  # a change whatever the clock's resolution
    assert watched.fetch() is not None
    assert watched.loaded.cert == open(files["other"], "rb").read() and watched.reloads == 1
    key.unlink()  # a file gone: the last good state stays
    assert watched.fetch() is None and watched.reloads == 1


@pytest.mark.parametrize(
    "server, flags, words",
    [
        ("127.0.0.1:1", ["--tls-cert", "c.pem"], ["tls_cert", "tls_key"]),
        ("unix:///tmp/x.sock", ["--tls"], ["Unix socket", "tls=True"]),
        ("127.0.0.1:1", ["--tls-ca", "/no/such/ca.pem"], ["/no/such/ca.pem", "cannot read"]),
    ],
)
def test_the_maxtext_launcher_says_a_tls_mistake_in_one_line(
    capsys, monkeypatch, server, flags, words
):
    from input_client.maxtext import train

    monkeypatch.setenv("DECOUPLE_GCLOUD", "TRUE")
    with pytest.raises(SystemExit) as e:
        train.main(["--server", server, *flags, "grain_train_files=x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err


def test_the_servers_token_policy_does_not_show_its_token():
    from input_server.serving.auth import TokenPolicy

    assert "s3cret" not in repr(TokenPolicy(b"s3cret", tcp=True))


def test_keywords_are_the_inverse_of_of():
    given = {
        "tls": True,
        "tls_ca": "ca.pem",
        "tls_cert": "c.pem",
        "tls_key": "k.pem",
        "tls_server_name": "x.test",
    }
    assert TlsSettings.of(**given).keywords() == given
    assert TlsSettings().keywords()["tls"] is False
