"""A connection to an input server: its calls, and the batch streams it opens."""

from __future__ import annotations

import os
import time
from typing import Any

import grpc

from input_client import addresses
from input_client._reconnect import RECONNECT_OPTIONS, check_protocol
from input_client.auth import TokenInterceptor, check_token, read_token_file
from input_client.errors import StreamError
from input_client.iterator import BatchIterator
from input_client.proto import pb, pb_grpc
from input_client.spec import PipelineSpec
from input_client.wire import MESSAGE_OPTIONS, PROTOCOL_VERSION, is_resume_state


class InputClient:
    """A connection to an input server.

    Args:
      address: a gRPC target: `unix:///path/to.sock` (sidecar) or `host:port`; default the
        address a plain `input-server serve` listens on (`input_client.addresses.
        default_socket()`: a socket in $XDG_RUNTIME_DIR, else in `$TMPDIR/input-server-UID/`).
      connect_timeout_s: how long `batches()` and `info()` wait for the server to be reachable
        before raising, so a missing server is an error, not a hang. A `unix:` socket file
        that does not exist yet is waited for (a server starting); an address that can never
        work (a socket path without `unix://`) is refused at once.
      token: the shared token of a server started with `--token-file`, sent on every call
        (`authorization: Bearer TOKEN`). Its abstract sockets and TCP ports need it; its
        socket files do not (their file mode admits only the server's user), unless it also
        serves an abstract socket that needs the token.
      token_file: a file holding the token instead (read once, whitespace stripped).

    Raises:
      ValueError: both `token` and `token_file`, or an empty or non-ASCII token.
      OSError: `token_file` cannot be read.
      PermissionError: no `address`, and the default socket's folder is not ours alone
        (another user could have put a server there).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        connect_timeout_s: float = 30.0,
        token: str | None = None,
        token_file: str | None = None,
    ):
        if token is not None and token_file is not None:
            raise ValueError("pass `token` or `token_file`, not both.")
        if token_file is not None:
            token = read_token_file(token_file)
        elif token is not None:
            token = check_token(token, "`token`")
        if address is None:
            addresses.check_private_dir(addresses.default_socket_dir())
            address = addresses.default_socket()
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self._channel = grpc.insecure_channel(address, options=MESSAGE_OPTIONS + RECONNECT_OPTIONS)
        if token is not None:
            self._channel = grpc.intercept_channel(self._channel, TokenInterceptor(token))
        self._stub = pb_grpc.InputServiceStub(self._channel)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Blocks until the server is reachable and checks that it speaks this client's wire
        protocol.

        Raises:
          ConnectionError: no server reachable within the timeout; at once for an address
            that cannot work (a socket path without `unix://`, a `unix:` path that is no
            socket).
          StreamError: FAILED_PRECONDITION, the server speaks another wire protocol.
        """
        timeout_s = self.connect_timeout_s if timeout_s is None else timeout_s
        remaining = self._socket_file_ready(timeout_s)
        # A cheap call that waits for the connection (channel_ready_future leaves a polling
        # thread behind that fails once the channel closes).
        try:
            info = self._stub.GetInfo(pb.GetInfoRequest(), timeout=remaining, wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                path = addresses.socket_path(self.address)
                stale = path is not None and addresses.nobody_answers(path)
                hint = (
                    f": nobody answers on the socket file {path} (left by a server that was "
                    f"killed?); is `input-server serve` running?"
                    if stale
                    else "."
                )
                raise ConnectionError(
                    f"no input server reachable at {self.address!r} after {timeout_s:g} s{hint}"
                ) from None
            raise StreamError(e.code(), e.details()) from None
        check_protocol(info, self.address)

    def _socket_file_ready(self, timeout_s: float) -> float:
        """Says at once what no waiting can fix, waits for a `unix:` socket file to appear (a
        server starting), and returns the time left of `timeout_s`.

        Raises:
          ConnectionError: a path without its `unix://`, a `unix:` path that is not a socket,
            or no socket there within the timeout.
        """
        if addresses.looks_like_a_path(self.address):
            path = os.path.abspath(self.address)
            there = "is a socket file" if addresses.is_socket(path) else "looks like a path"
            raise ConnectionError(
                f"no input server reachable at {self.address!r}: it {there}, and a Unix "
                f"socket needs its scheme: unix://{path}"
            )
        path = addresses.socket_path(self.address)
        deadline = time.monotonic() + timeout_s
        if not path:
            return timeout_s
        while not os.path.exists(path):
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"no input server reachable at {self.address!r}: no socket at {path} "
                    f"after {timeout_s:g} s; is `input-server serve` running?"
                )
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if not addresses.is_socket(path):
            raise ConnectionError(
                f"no input server reachable at {self.address!r}: {path} is not a socket."
            )
        return max(0.0, deadline - time.monotonic())

    def info(self) -> pb.GetInfoResponse:
        """Server version, configured pipelines and the streams running now."""
        remaining = self._socket_file_ready(self.connect_timeout_s)
        try:
            return self._stub.GetInfo(pb.GetInfoRequest(), timeout=remaining, wait_for_ready=True)
        except grpc.RpcError as e:
            raise StreamError(e.code(), e.details()) from None

    def describe_tokenizer(self, spec: PipelineSpec) -> pb.TokenizerInfo:
        """The server's view of `spec`'s model, of any `tokenizer.kind`: vocabulary size,
        special ids (-1 where the model has none) and the SHA-256 of the file its tokens come
        from (the `.model`, the `tokenizer.json`, or the tiktoken ranks file).

        Raises:
          StreamError: the model is outside the server's data roots (PERMISSION_DENIED),
            missing (NOT_FOUND) or not a model (INVALID_ARGUMENT).
        """
        try:
            return self._stub.DescribeTokenizer(
                spec.to_proto().tokenizer, timeout=self.connect_timeout_s, wait_for_ready=True
            )
        except grpc.RpcError as e:
            raise StreamError(e.code(), e.details()) from None

    def batches(
        self,
        spec: PipelineSpec | str,
        *,
        state: dict[str, Any] | None = None,
        prefetch: int = 2,
        sharding: Any = None,
        reconnect_deadline_s: float = 300.0,
    ) -> BatchIterator:
        """Streams the batches of `spec` (or of the pipeline the server knows by that name).

        Args:
          spec: a `PipelineSpec`, or the name of a pipeline the server was started with.
          state: a `get_state()` result, to continue right after the batch it belongs to.
          prefetch: batches fetched and decoded ahead of the training loop.
          sharding: a `jax.sharding.Sharding`; when given, batches are global `jax.Array`s
            built from this process's data (`jax.make_array_from_process_local_data`).
          reconnect_deadline_s: when the stream breaks (the server is killed, restarts, drains,
            or the connection drops), the iterator reconnects by itself and continues right
            after the last batch it received, for at most this long per outage; then `next()`
            raises `ReconnectError`. 0 = never reconnect: the failure raises at once. Five
            minutes covers a rescheduled server process, not a lost host.

        Raises:
          ConnectionError: no server reachable within `connect_timeout_s`.
        """
        if state is not None and not is_resume_state(state):
            raise ValueError(
                f"`state` must be a get_state() result (a dict with an integer "
                f"'seq'), got {str(state)[:200]}."
            )
        if prefetch < 1:
            raise ValueError(f"`prefetch` must be at least 1, got {prefetch}.")
        if not reconnect_deadline_s >= 0:
            raise ValueError(
                f"`reconnect_deadline_s` must be 0 (off) or positive, got {reconnect_deadline_s}."
            )
        request = pb.StreamBatchesRequest(protocol_version=PROTOCOL_VERSION)
        if isinstance(spec, str):
            request.pipeline_name = spec
        else:
            request.spec.CopyFrom(spec.to_proto())
        self.wait_ready()
        return BatchIterator(
            self._stub,
            self.address,
            request,
            state=state,
            prefetch=prefetch,
            sharding=sharding,
            reconnect_deadline_s=reconnect_deadline_s,
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> InputClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
