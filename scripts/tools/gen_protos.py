"""Regenerates the checked-in protobuf and gRPC stubs from proto/.

`python scripts/tools/gen_protos.py [OUT_ROOT]` (default: the repository). A test regenerates them
into a temporary folder and fails on any difference from the checked-in files.

The generator is grpcio-tools 1.65.5, the newest whose stubs load on every protobuf runtime the
client declares (5.26.1 through 7.x, with no version check in the generated code) and on
grpcio 1.66.2, the first grpcio with Python 3.13 wheels; docs/architecture.md says how that
was measured. It asks for protobuf < 6, which cannot sit beside the server's protobuf 7, so it
is installed alone (`pip install --no-deps --target`) into a cached folder and run there.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]  # this is scripts/tools/
PROTO = ROOT / "proto"
SERVICE_STUBS = pathlib.Path("client/input_client/_proto")
GENERATED = (
    SERVICE_STUBS / "input_server/v1/input_service_pb2.py",
    SERVICE_STUBS / "input_server/v1/input_service_pb2.pyi",
    SERVICE_STUBS / "input_server/v1/input_service_pb2_grpc.py",
    SERVICE_STUBS / "input_server/v1/input_service.proto",  # shipped with the client's wheel
    pathlib.Path("input_server/tf_example_pb2.py"),
)


TOOLS_VERSION = "1.65.5"
# grpcio-tools 1.65.5 has wheels for CPython 3.8-3.12; a newer interpreter runs it under one.
TOOLS_PYTHONS = ("3.12", "3.11", "3.10")


def _tools_python() -> str:
    if sys.version_info < (3, 13):
        return sys.executable
    from input_server.testing.processes import find_python

    for version in TOOLS_PYTHONS:
        if found := find_python(version):
            return found
    sys.exit(f"grpcio-tools {TOOLS_VERSION} needs Python 3.12 or older to run; none found.")


def _tools(python: str) -> pathlib.Path:
    version = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    tools = cache / "input-server" / f"grpcio-tools-{TOOLS_VERSION}-py{version}"
    if not (tools / "grpc_tools").is_dir():
        # Into a fresh folder, renamed into place once whole: an interrupted install leaves
        # nothing that looks finished.
        tools.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tools.parent, ignore_cleanup_errors=True) as partial:
            subprocess.run(
                [
                    python,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--target",
                    partial,
                    f"grpcio-tools=={TOOLS_VERSION}",
                ],
                check=True,
            )
            shutil.rmtree(tools, ignore_errors=True)
            os.rename(partial, tools)
    return tools


def _protoc(*args: str) -> None:
    python = _tools_python()
    tools = _tools(python)
    # -S: no site-packages, so the environment's own protobuf and grpcio stay out of it.
    command = [
        python,
        "-S",
        "-c",
        "import sys; from grpc_tools import protoc; sys.exit(protoc.main(sys.argv[1:]))",
        "protoc",
        f"-I{PROTO}",
        f"-I{tools / 'grpc_tools' / '_proto'}",
        *args,
    ]
    if subprocess.run(command, env={**os.environ, "PYTHONPATH": str(tools)}).returncode != 0:
        sys.exit(f"protoc failed on {args[-1]}")


def generate(out_root: pathlib.Path = ROOT) -> None:
    service_out = out_root / SERVICE_STUBS
    service_out.mkdir(parents=True, exist_ok=True)
    # The service stubs belong to the thin client package; the server imports them from there.
    _protoc(
        f"--python_out={service_out}",
        f"--pyi_out={service_out}",
        f"--grpc_python_out={service_out}",
        str(PROTO / "input_server" / "v1" / "input_service.proto"),
    )
    # grpc_tools writes an absolute import derived from the proto path
    # (`from input_server.v1 import ...`), which would name the server package; make it relative.
    grpc_file = out_root / GENERATED[2]
    text = grpc_file.read_text()
    grpc_file.write_text(text.replace("from input_server.v1 import", "from . import"))
    # The contract itself travels with the stubs, for users who generate their own.
    (service_out / "input_server/v1/input_service.proto").write_bytes(
        (PROTO / "input_server/v1/input_service.proto").read_bytes()
    )
    # The tf.train.Example copy is only for the server; the proto root mirrors its package path.
    (out_root / "input_server").mkdir(exist_ok=True)
    _protoc(f"--python_out={out_root}", str(PROTO / "input_server" / "tf_example.proto"))


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
