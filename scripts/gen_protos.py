"""Regenerates the checked-in protobuf and gRPC stubs from proto/.

`python scripts/gen_protos.py [OUT_ROOT]` (default: the repository). A test regenerates them
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
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
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
_PY = f"py{sys.version_info[0]}.{sys.version_info[1]}"
TOOLS = (pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
         / "input-server" / f"grpcio-tools-{TOOLS_VERSION}-{_PY}")


def _tools() -> pathlib.Path:
    if not (TOOLS / "grpc_tools").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--only-binary=:all:", "--target", str(TOOLS),
                        f"grpcio-tools=={TOOLS_VERSION}"], check=True)
    return TOOLS


def _protoc(*args: str) -> None:
    tools = _tools()
    command = [sys.executable, "-c", "import sys; from grpc_tools import protoc; "
               "sys.exit(protoc.main(sys.argv[1:]))",
               "protoc", f"-I{PROTO}", f"-I{tools / 'grpc_tools' / '_proto'}", *args]
    # Only the generator's folder: the environment's own protobuf and grpcio stay out of it.
    if subprocess.run(command, env={**os.environ, "PYTHONPATH": str(tools)}).returncode != 0:
        sys.exit(f"protoc failed on {args[-1]}")


def generate(out_root: pathlib.Path = ROOT) -> None:
    service_out = out_root / SERVICE_STUBS
    service_out.mkdir(parents=True, exist_ok=True)
    # The service stubs belong to the thin client package; the server imports them from there.
    _protoc(f"--python_out={service_out}", f"--pyi_out={service_out}",
            f"--grpc_python_out={service_out}",
            str(PROTO / "input_server" / "v1" / "input_service.proto"))
    # grpc_tools writes an absolute import derived from the proto path
    # (`from input_server.v1 import ...`), which would name the server package; make it relative.
    grpc_file = out_root / GENERATED[2]
    text = grpc_file.read_text()
    grpc_file.write_text(text.replace("from input_server.v1 import", "from . import"))
    # The contract itself travels with the stubs, for users who generate their own.
    (service_out / "input_server/v1/input_service.proto").write_bytes(
        (PROTO / "input_server/v1/input_service.proto").read_bytes())
    # The tf.train.Example copy is only for the server; the proto root mirrors its package path.
    (out_root / "input_server").mkdir(exist_ok=True)
    _protoc(f"--python_out={out_root}", str(PROTO / "input_server" / "tf_example.proto"))


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
