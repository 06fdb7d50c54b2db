"""The gRPC servicer: glue that validates requests, admits streams, reports status.

Every exception a request meets becomes a status in one place (`guards.guard_stream` and
`guard_unary`, with `errors.status_of`): nothing escapes to gRPC, which would send UNKNOWN.
A stream's life is its own (`stream.Stream`), its admission the registry's (`streams.Streams`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import grpc

from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION, protocol_mismatch
from input_server.autotune.openings import Openings
from input_server.autotune.policy import cpu_count
from input_server.batching.pipeline import Pipeline
from input_server.data.roots import DataAccess
from input_server.data.tokenizers.base import AUDIT_EVERY
from input_server.errors import InvalidSpecError, RefusedError
from input_server.quoting import quote_message
from input_server.serving.coalesce import MESSAGE_TOKENS
from input_server.serving.describe import describe_tokenizer
from input_server.serving.guards import guard_stream, guard_unary, parsed
from input_server.serving.limits import Limits
from input_server.serving.slots import ProcessPool
from input_server.serving.stream import Shared
from input_server.serving.streams import Streams
from input_server.version import __version__


class InputServicer(pb_grpc.InputServiceServicer):
    """Streams batches of request specs or of pipelines named at start-up.

    Args:
      pipelines: pipelines by name, already built (so their errors surfaced at start-up).
      max_streams: concurrent streams; one more gets RESOURCE_EXHAUSTED at once, never a wait.
      queue_depth: batches each stream produces ahead of the sender.
      message_tokens: the most tokens of batches that share a message (see `coalesce`).
      audit_every: a request's fast tokenizer backend is audited on one group in this many.
      token_cache: where documents' ids are kept across epochs (`data.token_cache`); None.
      tokenizer_cache: where what is derived from tokenizer models is kept
        (`tokenizers.keep.ModelKeep`); None: in memory only.
      draining: set when the server stops; streams then end with UNAVAILABLE.
      openings: how each stream opens, by its `workers` table (the server's, with its
        remembered choices); default a new one.
      limits: what a request may read and hold; default unlimited, files of any path.
    """

    def __init__(
        self,
        pipelines: Mapping[str, Pipeline],
        *,
        max_streams: int,
        queue_depth: int,
        draining: threading.Event,
        message_tokens: int = MESSAGE_TOKENS,
        audit_every: int = AUDIT_EVERY,
        token_cache=None,
        tokenizer_cache=None,
        openings: Openings | None = None,
        limits: Limits | None = None,
    ):
        self._pipelines = dict(pipelines)
        self._limits = limits or Limits(
            access=DataAccess(), stream_memory_mb=float("inf"), max_workers=cpu_count() or 1
        )
        self._draining = draining
        self._streams = Streams(
            Shared(
                pipelines=self._pipelines,
                limits=self._limits,
                queue_depth=queue_depth,
                message_tokens=message_tokens,
                pipeline_options={
                    "audit_every": audit_every,
                    "token_cache": token_cache,
                    "tokenizer_cache": tokenizer_cache,
                    # A backend not loaded yet loads while the reference serves: a restarted
                    # sidecar's first batch does not wait for it. Not with a token cache: it
                    # keeps the reference's ids alone, decided when a pipeline is set up.
                    "load_behind": token_cache is None,
                },
                draining=draining,
                openings=openings or Openings(),
                processes=ProcessPool(self._limits.max_workers),
            ),
            max_streams=max_streams,
        )
        self.max_handlers = self._streams.max_handlers

    @guard_stream
    def StreamBatches(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[pb.Batch]:
        # The first request names the pipeline; the later ones are the client's credit.
        try:
            request = parsed(pb.StreamBatchesRequest, next(requests))
        except StopIteration:
            raise InvalidSpecError("the stream carried no request.") from None
        # Batches laid out another way would be misread (or raise out of sequence).
        refusal = protocol_mismatch(
            f"this server (input-server {__version__})", PROTOCOL_VERSION, request.protocol_version
        )
        if refusal:
            raise RefusedError(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        if self._draining.is_set():
            raise RefusedError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down.")
        with self._streams.admit(request, requests, context) as stream:
            yield from stream.messages()

    def active_requests(self) -> int:
        """Streams being set up, running or closing."""
        return self._streams.active_requests()

    def drain(self) -> None:
        """Ends the running streams with UNAVAILABLE now; call after setting `draining`."""
        self._streams.drain()

    @guard_unary(pb.Tokenizer)
    def DescribeTokenizer(
        self, request: pb.Tokenizer, context: grpc.ServicerContext
    ) -> pb.TokenizerInfo:
        return describe_tokenizer(request, self._limits.access)

    @guard_unary(pb.GetInfoRequest)
    def GetInfo(
        self, request: pb.GetInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetInfoResponse:
        return self.info()

    def info(self) -> pb.GetInfoResponse:
        """What GetInfo answers (and the metrics read): the server, its pipelines, its streams
        and the totals over every stream it ran."""
        streams, totals = self._streams.info()
        # Quoted once here, for every reader (GetInfo's clients, the metrics' labels): a
        # stream's label and reasons repeat what its client wrote.
        return quote_message(
            pb.GetInfoResponse(
                server_version=__version__,
                protocol_version=PROTOCOL_VERSION,
                pipelines={name: p.spec.to_proto() for name, p in self._pipelines.items()},
                streams=streams,
                totals=totals,
            )
        )


def add_to_server(servicer: InputServicer, server: grpc.Server) -> None:
    """Registers `servicer` taking its requests as bytes, parsed inside its guard: gRPC's own
    parsing answers a request that does not parse with INTERNAL ("Exception deserializing
    request!"), out of the guard's reach, and grpcio 1.85 then keeps ~17 KB per such request."""
    handlers = {
        "StreamBatches": grpc.stream_stream_rpc_method_handler(
            servicer.StreamBatches, response_serializer=pb.Batch.SerializeToString
        ),
        "GetInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetInfo, response_serializer=pb.GetInfoResponse.SerializeToString
        ),
        "DescribeTokenizer": grpc.unary_unary_rpc_method_handler(
            servicer.DescribeTokenizer, response_serializer=pb.TokenizerInfo.SerializeToString
        ),
    }
    name = pb.DESCRIPTOR.services_by_name["InputService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
