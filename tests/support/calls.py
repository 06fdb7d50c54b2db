"""Raw calls to servers, real and fake: channels sending a target's token, a stream's messages
or status as they come off the wire."""

from __future__ import annotations

import time

# The tokens of the servers tests started, by target: the helpers below send a target's token.
TOKENS: dict[str, str] = {}


def dial(target: str, token: str | None = None, options=()):
    """A raw gRPC channel to `target`, sending `token` (default the target's in `TOKENS`)."""
    import grpc

    from input_client.auth import TokenInterceptor

    channel = grpc.insecure_channel(target, options=list(options))
    token = TOKENS.get(target) if token is None else token
    return grpc.intercept_channel(channel, TokenInterceptor(token)) if token else channel


def raw_messages(target: str, spec, pause_s: float = 0.0, token: str | None = None) -> list:
    """A stream's messages as they arrive on the wire (no client iterator in between, and no
    client-side validation of a proto `spec`); after the first, waits `pause_s` so that the
    server's queue fills. Sends `token` (default the target's in `TOKENS`)."""
    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    spec = spec if isinstance(spec, pb.PipelineSpec) else spec.to_proto()
    with dial(target, token) as channel:
        call = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)])
        )
        messages = [next(call)]
        time.sleep(pause_s)
        messages += list(call)
    return messages


def stream_status(target: str, spec, take: int | None = None, timeout: float = 60) -> tuple:
    """(status, details, messages read) of a raw StreamBatches request of `spec` (a proto):
    read to its end, or cancelled (OK) once `take` messages came."""
    import grpc

    from input_client.proto import pb, pb_grpc
    from input_client.wire import PROTOCOL_VERSION

    with grpc.insecure_channel(target) as channel:
        stream = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
            timeout=timeout,
        )
        n = 0
        try:
            for _ in stream:
                n += 1
                if take is not None and n >= take:
                    stream.cancel()
                    return grpc.StatusCode.OK, "", n
        except grpc.RpcError as e:
            return e.code(), e.details(), n
        return grpc.StatusCode.OK, "", n
