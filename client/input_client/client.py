"""A connection to an input server: its calls, and the batch streams it opens."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import grpc

from input_client import addresses
from input_client._connect_wait import ConnectWait, socket_file_ready
from input_client._reconnect import channel_options, check_protocol
from input_client._server_checks import BadBatch, Expected, expected_of
from input_client.auth import TokenInterceptor, check_token, read_token_file
from input_client.elastic import ELASTIC, reshard_servers
from input_client.errors import StreamError
from input_client.fanin import ORDERS, STATE_KEY, FanInIterator, fan_in
from input_client.iterator import BatchIterator
from input_client.proto import pb, pb_grpc
from input_client.spec import PipelineSpec
from input_client.tls import TlsSettings, open_channel, refuse_token_in_the_clear
from input_client.tls_diagnosis import DIAGNOSIS_TIMEOUT_S, diagnose, wait_diagnosing
from input_client.wire import (
    PROTOCOL_VERSION,
    client_message_options,
    encode_state,
    is_resume_state,
)


class InputClient:
    """A connection to an input server.

    Args:
      address: a gRPC target: `unix:///path/to.sock` (sidecar) or `host:port`; default the
        address a plain `input-server serve` listens on (`input_client.addresses.
        default_socket()`: a socket in $XDG_RUNTIME_DIR, else in `$TMPDIR/input-server-UID/`).
        A list of N targets fans in from N servers (`input_client.fanin`; a StatefulSet's
        names: `fanin.pool_addresses`), every other option applying to each; `members` are
        the clients of each. A list of one is that one server.
      connect_timeout_s: how long `batches()` and `info()` wait for the server to be reachable
        before raising, so a missing server is an error, not a hang. A `unix:` socket file
        that does not exist yet is waited for (a server starting), and said in one warning
        within a second, naming the other default path where a server answers if one does
        (a `serve` with another XDG_RUNTIME_DIR); an address that can never work (a socket
        path without `unix://`) is refused at once. A stream the server refuses at its start
        because its set-up queue is full (it is reading other clients' resumed states) is
        opened again, backing off, for this long too (said once in a warning).
      token: the shared token of a server started with `--token-file`, sent on every call
        (`authorization: Bearer TOKEN`). Its abstract sockets and TCP ports need it; its
        socket files do not (their file mode admits only the server's user), unless it also
        serves an abstract socket that needs the token.
      token_file: a file holding the token instead (read once, whitespace stripped).
      tls: connect with TLS, the server's certificate verified by gRPC's default roots (a
        public CA). For a server started with `--tls-cert`.
      tls_ca: a PEM file of the CA certificates that verify the server's certificate (a
        private CA); implies `tls`.
      tls_cert, tls_key: a PEM client certificate chain and its unencrypted key, for a server
        started with `--tls-client-ca` (mutual TLS); both or neither.
      tls_server_name: the name the server's certificate must hold when it is not the host
        dialed (e.g. dialing an IP).

    A TLS mistake (a plaintext client and a TLS server or the reverse, an untrusted or expired
    certificate, a wrong name, a missing or refused client certificate) raises
    `ConnectionError` saying which, within about a second rather than after
    `connect_timeout_s` (`tls_diagnosis.diagnose`).

    Raises:
      ValueError: both `token` and `token_file`, or an empty or non-ASCII token; `tls_cert`
        without `tls_key` or the reverse; TLS options for a `unix:` address; a TLS file that
        is not PEM of its kind.
      OSError: `token_file` or a TLS file cannot be read.
      PermissionError: no `address`, and the default socket's folder is not ours alone
        (another user could have put a server there).
    """

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        connect_timeout_s: float = 30.0,
        token: str | None = None,
        token_file: str | None = None,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
    ):
        self.members: list[InputClient] = []  # one client per server, when fanning in
        if address is not None and not isinstance(address, str):
            targets = list(address)
            if not targets or not all(isinstance(a, str) and a for a in targets):
                raise ValueError(
                    f"`address` must be an address or a list of them, got {address!r}."
                )
            if len(set(targets)) != len(targets):
                raise ValueError(f"`address` names a server twice: {targets}.")
            if len(targets) > 1:
                options = dict(
                    connect_timeout_s=connect_timeout_s,
                    token=token,
                    token_file=token_file,
                    tls=tls,
                    tls_ca=tls_ca,
                    tls_cert=tls_cert,
                    tls_key=tls_key,
                    tls_server_name=tls_server_name,
                )
                try:
                    for a in targets:
                        self.members.append(InputClient(a, **options))
                except BaseException:
                    self.close()
                    raise
                self.address = ",".join(targets)
                self.connect_timeout_s = connect_timeout_s
                return
            address = targets[0]
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
        self._tls = TlsSettings.of(
            tls=tls,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_server_name=tls_server_name,
        )
        if token is not None and not self._tls.enabled:
            refuse_token_in_the_clear(address)
        # The token only inside its interceptor: never an attribute a repr or vars() shows.
        self._interceptor = TokenInterceptor(token) if token is not None else None
        self._channel = self._open_channel(client_message_options())
        self._stub = pb_grpc.InputServiceStub(self._channel)

    def _open_channel(self, message_options: list[tuple[str, int]]) -> grpc.Channel:
        """A channel to this client's server, TLS or not, with its token: made in one place
        for the unary calls and for each stream (whose receive limit its spec sizes)."""
        channel = open_channel(self.address, self._tls, message_options + channel_options())
        if self._interceptor is not None:
            channel = grpc.intercept_channel(channel, self._interceptor)
        return channel

    @property
    def connect_timeout_s(self) -> float:
        return self._connect_timeout_s

    @connect_timeout_s.setter
    def connect_timeout_s(self, value: float) -> None:
        """Set for every server of a fan-in too (each waits for its own)."""
        self._connect_timeout_s = value
        for m in self.members:
            m.connect_timeout_s = value

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Blocks until the server is reachable and checks that it speaks this client's wire
        protocol.

        Raises:
          ConnectionError: no server reachable within the timeout; at once for an address
            that cannot work (a socket path without `unix://`, a `unix:` path that is no
            socket) or a TLS mistake (`tls_diagnosis.diagnose`).
          StreamError: FAILED_PRECONDITION, the server speaks another wire protocol.
        """
        timeout_s = self.connect_timeout_s if timeout_s is None else timeout_s
        if self.members:  # every server, within one timeout
            deadline = time.monotonic() + timeout_s
            for m in self.members:  # each at least a second: a late one is named fairly
                m.wait_ready(max(1.0, deadline - time.monotonic()))
            return
        self._ready_info(timeout_s)

    def _ready_info(self, timeout_s: float | None = None) -> pb.GetInfoResponse:
        """`wait_ready` for one server, returning its info (its named pipelines' specs)."""
        timeout_s = self.connect_timeout_s if timeout_s is None else timeout_s
        waiting = ConnectWait(self.address, self._tls, timeout_s)
        try:
            info = self._get_info(timeout_s, waiting)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ConnectionError(waiting.timed_out()) from None
            raise StreamError(e.code(), e.details()) from None
        check_protocol(info, self.address)
        return info

    def _get_info(self, timeout_s: float, waiting: ConnectWait | None = None) -> pb.GetInfoResponse:
        """GetInfo once the server is reachable, within `timeout_s`: a cheap call that waits
        for the connection (channel_ready_future leaves a polling thread behind that fails
        once the channel closes), and says at once what no waiting can fix.

        Raises:
          ConnectionError: see `_connect_wait.socket_file_ready`; a TLS mistake
            (`tls_diagnosis.diagnose`); a host name that does not exist.
          grpc.RpcError: the call's failure (DEADLINE_EXCEEDED: nobody answered in time).
        """
        waiting = waiting or ConnectWait(self.address, self._tls, timeout_s)
        remaining = socket_file_ready(self.address, timeout_s)
        call = self._stub.GetInfo.future(
            pb.GetInfoRequest(), timeout=remaining, wait_for_ready=True
        )
        return wait_diagnosing(call, waiting.diagnose, remaining)

    def _diagnose(self, timeout_s: float = DIAGNOSIS_TIMEOUT_S) -> str | None:
        """Why this client cannot connect, when a TLS handshake of its own tells (a plaintext
        client and a TLS server or the reverse, an untrusted, expired or misnamed certificate,
        a missing or refused client certificate); None otherwise (`tls_diagnosis.diagnose`).
        A stream's reconnect loop asks it: a name that vanished is waited for there."""
        return diagnose(self.address, self._tls, timeout_s=timeout_s)

    def info(self) -> pb.GetInfoResponse:
        """Server version, configured pipelines and the streams running now.

        Raises:
          ConnectionError: a TLS mistake, or an address that cannot work (see `wait_ready`).
          StreamError: the call failed (DEADLINE_EXCEEDED: no server within the timeout).
          ValueError: a client of several servers: ask one of `members`.
        """
        if self.members:
            raise ValueError(
                f"info() asks one server; this client fans in from {len(self.members)}: "
                f"ask each of `client.members`."
            )
        try:
            return self._get_info(self.connect_timeout_s)
        except grpc.RpcError as e:
            raise StreamError(e.code(), e.details()) from None

    def describe_tokenizer(self, spec: PipelineSpec) -> pb.TokenizerInfo:
        """The server's view of `spec`'s model, of any `tokenizer.kind`: vocabulary size,
        special ids (-1 where the model has none) and the SHA-256 of the file its tokens come
        from (the `.model`, the `tokenizer.json`, or the tiktoken ranks file).

        Raises:
          StreamError: the model is outside the server's data roots (PERMISSION_DENIED),
            missing (NOT_FOUND) or not a model (INVALID_ARGUMENT); FAILED_PRECONDITION, the
            servers of a fan-in describe the model differently (another file at its path).
        """
        if self.members:
            infos = [m.describe_tokenizer(spec) for m in self.members]
            for m, info in zip(self.members[1:], infos[1:], strict=True):
                if info != infos[0]:
                    raise StreamError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"the servers at {self.members[0].address!r} and {m.address!r} read "
                        f"different models at {spec.tokenizer.model!r} ({infos[0].sha256[:12]} "
                        f"and {info.sha256[:12]}...): every server of a fan-in must have "
                        f"the same files.",
                    )
            return infos[0]
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
        order: str = "round_robin",
    ) -> BatchIterator | FanInIterator:
        """Streams the batches of `spec` (or of the pipeline the server knows by that name).

        A client of several servers fans in: server j streams sub-shard j of the spec's shard,
        and the batches are interleaved in `order` (`input_client.fanin`); its `get_state()`
        holds every sub-stream's position.

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
          order: with several servers, "round_robin" (batch k from server k mod N: the stream
            is a pure function of the spec and N) or "arrival" (whichever server's batch is
            ready first: their throughputs add up, the order is not reproducible). One server
            ignores it.

        Raises:
          ConnectionError: no server reachable within `connect_timeout_s`.
          ValueError: a bad argument, or a `state` of another number of servers.
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
        if order not in ORDERS:
            raise ValueError(f"`order` must be one of {', '.join(ORDERS)}; got {order!r}.")
        options = dict(
            prefetch=prefetch, sharding=sharding, reconnect_deadline_s=reconnect_deadline_s
        )
        if self.members:
            return fan_in(self.members, spec, state=state, order=order, **options)
        if state is not None and STATE_KEY in state:  # a pool's state, now on one server
            state = reshard_servers(state, 1)
        info = self._ready_info()
        if isinstance(spec, str) and spec not in info.pipelines:
            known = ", ".join(sorted(info.pipelines))[:200] or "none configured"
            raise StreamError(
                grpc.StatusCode.NOT_FOUND,
                f"`pipeline_name`: no pipeline {spec[:100]!r} on the server at "
                f"{self.address!r} (known: {known}).",
            )
        named = info.pipelines[spec] if isinstance(spec, str) else None
        return self.open_stream(spec, state=state, named=named, **options)

    def open_stream(
        self,
        spec: PipelineSpec | str,
        *,
        state: dict[str, Any] | None,
        prefetch: int,
        sharding: Any,
        reconnect_deadline_s: float,
        on_item: Any = None,
        named: pb.PipelineSpec | None = None,
    ) -> BatchIterator:
        """The stream of `spec` from this one server, its arguments already checked and the
        server ready (`stream` checks them; a fan-in opens each member's stream here);
        `named`: the spec of the server's pipeline `spec` names, as its info gave it.

        The stream has a channel of its own, whose receive limit the spec's batch shape sizes
        (`_server_checks.Expected`): a server's oversized message is refused before the
        client allocates it.
        """
        request = pb.StreamBatchesRequest(protocol_version=PROTOCOL_VERSION)
        if isinstance(spec, str):
            request.pipeline_name = spec
        else:
            request.spec.CopyFrom(spec.to_proto())
        expected = self._expected(request.spec if named is None else named, spec)
        if state is not None and ELASTIC in state:  # its states hold the old hosts' states too
            grown = expected.state_bytes + len(encode_state(state))
            expected = dataclasses.replace(expected, state_bytes=grown)
        channel = self._open_channel(client_message_options(expected.receive_limit))
        try:
            return BatchIterator(
                pb_grpc.InputServiceStub(channel),
                self.address,
                request,
                state=state,
                prefetch=prefetch,
                sharding=sharding,
                expected=expected,
                reconnect_deadline_s=reconnect_deadline_s,
                start_deadline_s=self.connect_timeout_s,
                diagnose=self._diagnose,
                on_item=on_item,
                on_close=channel.close,
            )
        except BaseException:
            channel.close()
            raise

    def _expected(self, proto: pb.PipelineSpec, spec: PipelineSpec | str) -> Expected:
        try:
            return expected_of(proto)
        except BadBatch as e:  # a named pipeline the server describes without a shape
            raise StreamError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the server at {self.address!r} describes {e} for {spec!r}: no batches of "
                f"it can be checked.",
            ) from None

    def close(self) -> None:
        for m in self.members:
            m.close()
        channel = getattr(self, "_channel", None)  # none when fanning in
        if channel is not None:
            channel.close()

    def __enter__(self) -> InputClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
