"""The `input-client` distribution alone (client/pyproject.toml), in fresh venvs on the lowest
and highest Python it declares, at its dependency floors and at the newest releases: it installs
none of the server's packages, ships its .proto, loads its stubs without a warning, and streams
the same batches from a real server as this environment's client."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest

from tests.support import ROOT, batch_bytes, clean_copy, python_or_skip

CLIENT = ROOT / "client"
DECLARED = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
SERVER_PACKAGES = (
    "grain",
    "sentencepiece",
    "pyarrow",
    "array-record",
    "array_record",
    "jax",
    "orjson",
    "zstandard",
    "psutil",
    "google-crc32c",
    "input-server",
)


def _lowest_and_highest() -> tuple[str, str]:
    low = re.fullmatch(r">=(3\.\d+)", DECLARED["requires-python"]).group(1)
    return low, "3.13"  # the newest CPython the client is declared and tested for (README)


def _floors(version: str) -> list[str]:
    """`pkg==floor` for grpcio and protobuf (numpy too where its floor has wheels)."""
    pins = []
    for req in DECLARED["dependencies"]:
        m = re.match(r"(grpcio|protobuf|numpy)>=([\d.]+)", req)
        if m and not (m.group(1) == "numpy" and version >= "3.13"):
            name, floor = m.groups()
            pins.append(f"{name}~={floor}.0" if name == "numpy" else f"{name}=={floor}")
    return pins


CASES = [(py, deps) for py in _lowest_and_highest() for deps in ("floor", "newest")]

PROBE = textwrap.dedent("""
    import hashlib, importlib.metadata as md, importlib.resources, json, sys, warnings
    warnings.simplefilter("error", RuntimeWarning)  # the stubs' grpcio check
    warnings.simplefilter("error", UserWarning)  # protobuf's gencode check
    import numpy as np
    from input_client import InputClient, PipelineSpec
    import input_client.maxtext.train  # the adapter imports without MaxText or JAX
    spec = PipelineSpec.from_toml(sys.argv[2])
    proto = importlib.resources.files("input_client._proto") / "input_server/v1/input_service.proto"
    with InputClient(sys.argv[1], connect_timeout_s=30) as c:
        info = c.describe_tokenizer(spec)
        with c.batches(spec) as it:
            digests = [hashlib.sha256(b"".join(np.ascontiguousarray(b[k]).tobytes()
                                               for k in sorted(b))).hexdigest() for b in it]
    print(json.dumps({
        "python": sys.version.split()[0],
        "versions": {d: md.version(d) for d in ("grpcio", "protobuf", "numpy")},
        "installed": sorted(d.metadata["Name"].lower() for d in md.distributions()),
        "proto": proto.is_file(), "vocab": info.vocab_size, "digests": digests,
        "heavy": [m for m in ("grain", "sentencepiece", "jax") if m in sys.modules]}))
""")


@pytest.mark.client_dist
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("python", "deps"), CASES, ids=[f"py{p}-{d}" for p, d in CASES])
def test_the_client_alone(python, deps, server, make_spec, tmp_path):
    exe = python_or_skip(python, "the client's declared Pythons")
    venv = tmp_path / "venv"
    subprocess.run([exe, "-m", "venv", str(venv)], check=True, timeout=120)
    pins = _floors(python) if deps == "floor" else []
    client = clean_copy(CLIENT, tmp_path / "client")
    install = subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            str(client),
            *pins,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    spec = make_spec(batch={"seq_len": 64, "size": 4})
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(spec.to_toml())
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", PROBE, server.targets[0], str(spec_file)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["python"].startswith(python)
    if deps == "floor":
        for pin in pins:
            name, _, version = pin.partition("==")
            if version:
                assert got["versions"][name] == version, got["versions"]
    assert not set(got["installed"]) & set(SERVER_PACKAGES), got["installed"]
    assert got["proto"] and got["heavy"] == []
    from input_client import InputClient

    with InputClient(server.targets[0]) as c, c.batches(spec) as it:
        import hashlib

        want = [hashlib.sha256(batch_bytes(b)).hexdigest() for b in it]
    assert got["digests"] == want and len(want) > 5


@pytest.mark.client_dist
@pytest.mark.timeout(600)
def test_both_distributions_build_from_their_sdists(tmp_path):
    """`python -m build` makes each sdist, then its wheel from that sdist: the server's wheel
    holds the server alone and requires the client of its version by name; the client's
    holds the client and its .proto."""
    import zipfile

    tree = clean_copy(ROOT, tmp_path / "tree")  # a fresh clone's files; builds leave nothing
    for folder in (tree, tree / "client"):
        out = subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(folder)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wheels = {p.name.split("-")[0]: zipfile.ZipFile(p) for p in (tmp_path / "dist").glob("*.whl")}
    server, client = wheels["input_server"], wheels["input_client"]
    server_meta = next(n for n in server.namelist() if n.endswith("METADATA"))
    assert f"Requires-Dist: input-client=={DECLARED['version']}" in (
        server.read(server_meta).decode().splitlines()
    )
    assert not [n for n in server.namelist() if n.startswith("input_client/")]
    assert "input_client/_proto/input_server/v1/input_service.proto" in client.namelist()
    assert not [n for n in client.namelist() if n.startswith("input_server/")]
