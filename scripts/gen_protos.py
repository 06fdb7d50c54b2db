"""Regenerates the checked-in protobuf and gRPC stubs from proto/.

Run from anywhere: `python scripts/gen_protos.py`. CI runs it and fails on any diff.
"""

from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
SERVICE_OUT = ROOT / "client" / "input_client" / "_proto"


def _protoc(*args: str) -> None:
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    if protoc.main(["protoc", f"-I{PROTO}", f"-I{include}", *args]) != 0:
        sys.exit(f"protoc failed on {args[-1]}")


def main() -> None:
    # The service stubs belong to the thin client package; the server imports them from there.
    service = PROTO / "input_server" / "v1" / "input_service.proto"
    _protoc(f"--python_out={SERVICE_OUT}", f"--pyi_out={SERVICE_OUT}",
            f"--grpc_python_out={SERVICE_OUT}", str(service))
    # grpc_tools writes an absolute import derived from the proto path
    # (`from input_server.v1 import ...`), which would name the server package; make it relative.
    grpc_file = SERVICE_OUT / "input_server" / "v1" / "input_service_pb2_grpc.py"
    text = grpc_file.read_text()
    grpc_file.write_text(text.replace("from input_server.v1 import", "from . import"))
    # The tf.train.Example copy is only for the server; the proto root mirrors its package path.
    _protoc(f"--python_out={ROOT}", str(PROTO / "input_server" / "tf_example.proto"))


if __name__ == "__main__":
    main()
