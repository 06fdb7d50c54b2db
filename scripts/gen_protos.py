"""Regenerates the checked-in protobuf and gRPC stubs from proto/.

`python scripts/gen_protos.py [OUT_ROOT]` (default: the repository). A test regenerates them
into a temporary folder and fails on any difference from the checked-in files.
"""

from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
SERVICE_STUBS = pathlib.Path("client/input_client/_proto")
GENERATED = (
    SERVICE_STUBS / "input_server/v1/input_service_pb2.py",
    SERVICE_STUBS / "input_server/v1/input_service_pb2.pyi",
    SERVICE_STUBS / "input_server/v1/input_service_pb2_grpc.py",
    pathlib.Path("input_server/tf_example_pb2.py"),
)


def _protoc(*args: str) -> None:
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    if protoc.main(["protoc", f"-I{PROTO}", f"-I{include}", *args]) != 0:
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
    # The tf.train.Example copy is only for the server; the proto root mirrors its package path.
    (out_root / "input_server").mkdir(exist_ok=True)
    _protoc(f"--python_out={out_root}", str(PROTO / "input_server" / "tf_example.proto"))


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
