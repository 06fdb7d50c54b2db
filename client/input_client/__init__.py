"""input_client: the thin client of the input server (grpcio, protobuf, numpy; jax lazily)."""

from input_client.client import InputClient
from input_client.elastic import reshard
from input_client.errors import (
    InputClientError,
    ReconnectError,
    SequenceError,
    SpecError,
    StreamError,
)
from input_client.iterator import BatchIterator
from input_client.spec import (
    BatchSpec,
    OrderSpec,
    PipelineSpec,
    ShardSpec,
    SourceSpec,
    TokenizerSpec,
    WorkersSpec,
)
from input_client.step_record import StepRecord
from input_client.timing import StepTimer

__all__ = [
    "BatchIterator",
    "BatchSpec",
    "InputClient",
    "InputClientError",
    "OrderSpec",
    "PipelineSpec",
    "ReconnectError",
    "SequenceError",
    "ShardSpec",
    "SourceSpec",
    "SpecError",
    "StepRecord",
    "StepTimer",
    "StreamError",
    "TokenizerSpec",
    "WorkersSpec",
    "reshard",
]
