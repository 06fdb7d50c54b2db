"""Another local user (`nobody`) against a server run by this one: the kernel keeps it off the
socket files, the token off abstract sockets and TCP; `--socket-group` lets a group in.

The other user is real: a child interpreter imports what it needs as this user, then switches
to uid/gid 65534 (setgroups, setgid, setuid) before it connects, so the kernel judges every
connect() as nobody's. (`setpriv --reuid=65534 ...` before exec cannot be used where the
interpreter lives in a folder nobody may enter, e.g. pyenv under root's 0700 home.)
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid

import pytest

from input_client import InputClient
from input_server.serving.server import Server, ServerConfig
from tests.support import serve_cli, write_token_file

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")

_CHILD = textwrap.dedent("""
    import json, os, sys
    # Everything the probes use is imported now, while root's files are readable (grpc
    # imports some of its own modules lazily, at the first channel).
    import grpc, grpc._channel, grpc._interceptor
    from input_client.auth import TokenInterceptor
    from input_client.proto import pb, pb_grpc
    from input_client.spec import PipelineSpec
    from input_client.wire import PROTOCOL_VERSION

    probes, uid = json.loads(sys.argv[1]), int(sys.argv[2])
    requests = [pb.StreamBatchesRequest(spec=PipelineSpec.from_dict(p["spec"]).to_proto(),
                                        protocol_version=PROTOCOL_VERSION)
                if p.get("spec") else None for p in probes]
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    results = []
    for probe, request in zip(probes, requests):
        channel = grpc.insecure_channel(probe["target"])
        if probe.get("token"):
            channel = grpc.intercept_channel(channel, TokenInterceptor(probe["token"]))
        stub = pb_grpc.InputServiceStub(channel)
        try:
            if request is None:
                stub.GetInfo(pb.GetInfoRequest(), timeout=10)
            else:
                next(stub.StreamBatches(iter([request]), timeout=60))  # the first batch
            results.append(["OK", ""])
        except grpc.RpcError as e:
            results.append([e.code().name, e.details()])
        channel.close()
    print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "results": results}))
""")


def as_nobody(*probes: dict) -> list[tuple[str, str]]:
    """(status name, details) of each probe, run by uid/gid 65534: a probe is a `target`, with
    a `token` to send and a `spec` (a dict) to stream the first batch of, else GetInfo."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(probes), str(NOBODY)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["uid"] == report["gid"] == NOBODY  # the probes ran as nobody
    return [tuple(r) for r in report["results"]]


@pytest.fixture
def open_dir():
    """A folder every user may enter (0755, under /tmp): only the socket file's own mode
    stands between nobody and a socket in it. (pytest's tmp_path is under a 0700 folder.)"""
    path = tempfile.mkdtemp(prefix="input-server-test-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def refused_by_permissions(result: tuple[str, str]) -> bool:
    code, details = result
    return code == "UNAVAILABLE" and "Permission denied" in details


def test_nobody_cannot_reach_the_default_socket(open_dir):
    # TMPDIR is world-enterable here: the private folder inside it is the only barrier.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = open_dir
    child, targets = serve_cli(log=os.path.join(open_dir, "serve.log"), env=env)
    try:
        assert targets[0].startswith(f"unix://{open_dir}/input-server-{os.geteuid()}/")
        with InputClient(targets[0], connect_timeout_s=30) as c:
            assert c.info().server_version  # up, for its own user
        [result] = as_nobody({"target": targets[0]})
        assert refused_by_permissions(result), result
    finally:
        child.kill()


def test_nobody_cannot_connect_to_a_socket_file_in_an_open_folder(open_dir, make_spec):
    target = f"unix://{open_dir}/x.sock"
    with Server(ServerConfig(listen=[target])):
        info, stream = as_nobody(
            {"target": target}, {"target": target, "spec": make_spec().to_dict()}
        )
    assert refused_by_permissions(info), info
    assert refused_by_permissions(stream), stream


def test_nobody_needs_the_token_on_abstract_sockets_and_tcp(tmp_path, make_spec):
    token_file, token = write_token_file(tmp_path)
    abstract = f"unix-abstract:input-server-test-{uuid.uuid4().hex[:12]}"
    spec = make_spec().to_dict()
    with Server(ServerConfig(listen=["127.0.0.1:0", abstract], token_file=token_file)) as srv:
        probes = [
            {"target": t, "spec": spec, **extra}
            for t in srv.targets
            for extra in ({}, {"token": "guessed"}, {"token": token})
        ]
        results = as_nobody(*probes)
    for probe, (code, details) in zip(probes, results, strict=True):
        expected = "OK" if probe.get("token") == token else "UNAUTHENTICATED"
        assert code == expected, (probe["target"], probe.get("token"), code, details)


def test_socket_group_lets_nobodys_group_in(open_dir, make_spec):
    try:
        group = grp.getgrgid(NOBODY).gr_name
    except KeyError:
        group = str(NOBODY)
    target = f"unix://{open_dir}/x.sock"
    with Server(ServerConfig(listen=[target], socket_group=group)):
        info, stream = as_nobody(
            {"target": target}, {"target": target, "spec": make_spec().to_dict()}
        )
    assert info == ("OK", ""), info
    assert stream == ("OK", ""), stream
