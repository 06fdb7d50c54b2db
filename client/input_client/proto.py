"""The one import path of the generated stubs: `from input_client.proto import pb, pb_grpc`."""

from input_client._proto.input_server.v1 import input_service_pb2 as pb
from input_client._proto.input_server.v1 import input_service_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
