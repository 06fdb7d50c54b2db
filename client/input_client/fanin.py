"""One logical stream from N servers: each serves a sub-shard of this host's shard, and the
client interleaves their batches.

Server j of N reads sub-shard j of the host's shard. Shards are strided (shard `i` of `c` reads
records `i, i + c, i + 2c, ...`), so sub-shard j of host shard `i` of `c` is shard `i + c·j` of
`c·N`: its records are exactly the host shard's records number j, j + N, j + 2N, ... Every
record of the host's shard is in one sub-shard, and no record of another host's shard is.

Each sub-stream is an ordinary `BatchIterator`, with its own prefetch, flow control (so each
server sees its share of the trainer's pace, and an "auto" server tunes to it), reconnect and
exactly-once sequence checks. The fan-in's state is every sub-stream's state after the last
batch taken from it, so resuming continues each sub-stream exactly, whichever order the batches
were taken in. On another number of servers (a pool that grew or shrank), `fan_in` reshards the
host's state first (`elastic.reshard_servers`): every document still comes once.

Orders:
  round_robin (default): batch k comes from server k mod N (servers whose sub-stream has ended
    are skipped), so the stream is a pure function of the spec and N. It differs from the
    stream of one server (N = 1): the same documents, packed per sub-shard.
  arrival: whichever server's next batch is ready first (scanned in turn from the one after
    the last taken, so none starves). Throughput is the sum of the servers', not N times the
    slowest; still exactly once, but the order is not reproducible.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from input_client.elastic import FAN_IN, reshard_servers
from input_client.errors import ReconnectError, SequenceError, StreamError
from input_client.spec import PipelineSpec, ShardSpec

ORDERS = ("round_robin", "arrival")
# The key of a fanned-in state that holds the sub-streams' positions.
STATE_KEY = FAN_IN
_WAKE_S = 0.1  # the arrival order's longest sleep between looks (a lost wake-up costs this)


def sub_shard(spec: PipelineSpec, j: int, n: int) -> PipelineSpec:
    """`spec` for server `j` of `n`: sub-shard j of its shard (shard `index + count·j` of
    `count·n`). `n` = 1 leaves the spec as it is."""
    if n == 1:
        return spec
    s = spec.shard
    return dataclasses.replace(
        spec, shard=ShardSpec(index=s.index + s.count * j, count=s.count * n)
    )


def pool_addresses(
    name: str,
    replicas: int,
    *,
    port: int,
    namespace: str = "default",
    service: str | None = None,
    cluster_domain: str | None = None,
) -> list[str]:
    """The stable addresses of a StatefulSet's pods behind its headless Service, in ordinal
    order (ordinal = sub-shard index): `NAME-0.SERVICE.NAMESPACE.svc:PORT`, ...

    Args:
      name: the StatefulSet's name (its pods are NAME-0 ... NAME-(replicas-1)).
      replicas: the StatefulSet's replicas.
      port: the servers' port.
      namespace: the StatefulSet's namespace.
      service: the headless Service (the StatefulSet's `serviceName`); default `name`.
      cluster_domain: e.g. "cluster.local" to write fully qualified names; default the short
        `...svc` form, which the pod's DNS search path completes.
    """
    if replicas < 1:
        raise ValueError(f"`replicas` must be at least 1, got {replicas}.")
    if not 0 < port < 65536:
        raise ValueError(f"`port` must be 1 to 65535, got {port}.")
    suffix = f".{cluster_domain}" if cluster_domain else ""
    return [f"{name}-{i}.{service or name}.{namespace}.svc{suffix}:{port}" for i in range(replicas)]


@dataclasses.dataclass
class _Position:
    """Where the fan-in is: what `get_state()` returns, as fields."""

    seq: int  # batches taken from the fan-in
    streams: list[dict[str, Any] | None]  # each sub-stream's state after its last batch taken
    next: int = 0  # round robin: the server whose batch comes next
    ended: list[int] = dataclasses.field(default_factory=list)  # sub-streams that ended

    def to_state(self, order: str) -> dict[str, Any]:
        return {
            "seq": self.seq,
            STATE_KEY: {
                "servers": len(self.streams),
                "order": order,
                "next": self.next,
                "ended": sorted(self.ended),
                "streams": [dict(s) if s is not None else None for s in self.streams],
            },
        }


def position_of(state: dict[str, Any] | None, addresses: Sequence[str]) -> _Position:
    """The position a fanned-in `get_state()` result holds, checked against this client's
    servers (`state` None: the start).

    Raises:
      ValueError: one line naming what does not fit: the state of one server's stream, or of
        another number of servers (their sub-shards differ), or a malformed state.
    """
    n = len(addresses)
    if state is None:
        return _Position(seq=0, streams=[None] * n)
    fan = state.get(STATE_KEY)
    if fan is None:
        raise ValueError(
            f"`state` is the state of one server's stream; this client fans in from {n} "
            f"servers, whose sub-shards differ from one server's shard: resuming with another "
            f"number of servers is refused. Resume with the one server it came from."
        )

    def bad(what: str) -> ValueError:
        return ValueError(f"`state`['{STATE_KEY}'] {what}: not a fanned-in get_state() result.")

    if not isinstance(fan, dict):
        raise bad("is not an object")
    servers = fan.get("servers")
    if type(servers) is not int:
        raise bad("has no integer 'servers'")
    if servers != n:
        raise ValueError(
            f"`state` was fanned in from {servers} servers; this iterator has {n} "
            f"({', '.join(addresses)}), and server j of N reads sub-shard j of N: open it "
            f"through `fan_in`, or pass the state through `elastic.reshard_servers` first."
        )
    streams, nxt, ended = fan.get("streams"), fan.get("next", 0), fan.get("ended", [])
    if not isinstance(streams, list) or len(streams) != n:
        raise bad(f"needs 'streams', a list of {n} states")
    for j, s in enumerate(streams):
        if s is not None and not (
            isinstance(s, dict) and type(s.get("seq")) is int and s["seq"] >= 0
        ):
            raise bad(f"'streams'[{j}] is not a stream's state")
    if type(nxt) is not int or not 0 <= nxt < n:
        raise bad(f"'next' must be a server number from 0 to {n - 1}")
    if (
        not isinstance(ended, list)
        or any(type(j) is not int or not 0 <= j < n for j in ended)
        or len(set(ended)) != len(ended)
    ):
        raise bad(f"'ended' must list distinct server numbers from 0 to {n - 1}")
    if len(ended) == n:
        pass  # every sub-stream ended: the fan-in ends at once, as a finished stream does
    elif nxt in ended:
        raise bad("'next' names a server whose sub-stream ended")
    return _Position(seq=state["seq"], streams=list(streams), next=nxt, ended=list(ended))


def _servers_of(state: dict[str, Any]) -> Any:
    fan = state.get(STATE_KEY)
    return fan.get("servers") if isinstance(fan, dict) else 1


def fan_in(
    clients: Sequence[Any],
    spec: PipelineSpec | str,
    *,
    state: dict[str, Any] | None,
    order: str,
    **stream_options: Any,
) -> FanInIterator:
    """Opens the fanned-in stream of `spec` from `clients` (`InputClient`s, one per server, in
    sub-shard order); `stream_options` are `InputClient.batches()`'s.

    Raises:
      ValueError: `spec` is a pipeline's name (a server's named pipeline cannot be given a
        sub-shard), or `state` does not fit (`position_of`), or `order` is unknown.
      ConnectionError: a server is not reachable within its `connect_timeout_s`.
    """
    addresses = [c.address for c in clients]
    if not isinstance(spec, PipelineSpec):
        raise ValueError(
            f"fan-in from {len(clients)} servers needs a PipelineSpec, not the pipeline name "
            f"{spec!r}: each server is sent its own sub-shard of the spec."
        )
    if order not in ORDERS:
        raise ValueError(f"`order` must be one of {', '.join(ORDERS)}; got {order!r}.")
    if state is not None and _servers_of(state) != len(clients):  # a pool that changed size
        state = reshard_servers(state, len(clients))
    position_of(state, addresses)  # its mistakes before any server is dialed
    # One deadline for all: N servers starting together take about as long as one.
    deadline = time.monotonic() + max(c.connect_timeout_s for c in clients)
    for c in clients:
        c.wait_ready(max(1.0, deadline - time.monotonic()))
    n = len(clients)

    def open_stream(j: int, sub_state: dict[str, Any] | None, on_item: Callable[[], None]):
        return clients[j].open_stream(
            sub_shard(spec, j, n), state=sub_state, on_item=on_item, **stream_options
        )

    return FanInIterator(open_stream, addresses, state=state, order=order)


class FanInIterator:
    """Yields the batches of N sub-streams as one stream (see the module's docstring).

    Args:
      open_stream: `open_stream(j, state, on_item)` opens sub-stream j from its `state` (None:
        its start), a `BatchIterator` that calls `on_item()` whenever its queue gets an item.
      addresses: the servers, in sub-shard order (for messages and the state's check).
      state: a fanned-in `get_state()` result, or None.
      order: "round_robin" or "arrival".

    Attributes, as `BatchIterator`'s: wait_time_s, longest_stall_s, reconnects (all
    sub-streams'), batches_yielded, tokens_yielded. Each sub-stream's `wait_time_s` (what its
    server is told) is the part of the fan-in's wait spent on a batch of that server.
    """

    def __init__(
        self,
        open_stream: Callable[[int, dict[str, Any] | None, Callable[[], None]], Any],
        addresses: Sequence[str],
        *,
        state: dict[str, Any] | None = None,
        order: str = "round_robin",
    ):
        if order not in ORDERS:
            raise ValueError(f"`order` must be one of {', '.join(ORDERS)}; got {order!r}.")
        self.addresses = list(addresses)
        self.order = order
        self._pos = position_of(state, self.addresses)
        self._arrived = threading.Condition()
        self._subs: list[Any] = []
        self._done = len(self._pos.ended) == len(self.addresses)
        self.wait_time_s = 0.0
        self.longest_stall_s = 0.0
        self.batches_yielded = 0
        self.tokens_yielded = 0
        try:
            for j in range(len(self.addresses)):
                if j in self._pos.ended:
                    self._subs.append(None)
                else:
                    self._subs.append(open_stream(j, self._pos.streams[j], self._wake))
        except BaseException:
            self.close()
            raise

    @property
    def reconnects(self) -> int:
        return sum(s.reconnects for s in self._subs if s is not None)

    def _wake(self) -> None:
        with self._arrived:
            self._arrived.notify_all()

    def _live(self) -> list[int]:
        """The servers still streaming, in turn from `next`."""
        n = len(self.addresses)
        return [j for j in ((self._pos.next + k) % n for k in range(n)) if j not in self._pos.ended]

    def _choose(self) -> int:
        """The server whose batch comes next."""
        live = self._live()
        if self.order == "round_robin" or len(live) == 1:
            return live[0]
        with self._arrived:
            while True:
                for j in live:
                    if self._subs[j].ready():
                        return j
                self._arrived.wait(_WAKE_S)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        start = since = time.perf_counter()
        try:
            while not self._done:
                j = self._choose()
                sub = self._subs[j]
                try:
                    # The time spent choosing is a wait for this server's batch: each server
                    # is told its own consumer's wait, and theirs add up to the fan-in's.
                    batch = sub.take(time.perf_counter() - since)
                except StopIteration:
                    self._ended(j)
                    since = time.perf_counter()
                    continue
                except ReconnectError:
                    self.close()  # its message names the server already
                    raise
                except StreamError as e:
                    self.close()
                    raise StreamError(e.code, f"{self._name(j)}: {e.details}") from None
                except SequenceError as e:
                    self.close()
                    raise SequenceError(f"{self._name(j)}: {e}") from None
                except BaseException:
                    self.close()
                    raise
                p = self._pos
                p.streams[j] = sub.get_state()
                p.seq += 1
                p.next = (j + 1) % len(self.addresses)
                if p.next in p.ended and len(p.ended) < len(self.addresses):
                    p.next = self._live()[0]
                self.batches_yielded += 1
                self.tokens_yielded = sum(s.tokens_yielded for s in self._subs if s is not None)
                return batch
            raise StopIteration
        finally:
            waited = time.perf_counter() - start
            self.wait_time_s += waited
            self.longest_stall_s = max(self.longest_stall_s, waited)

    def _ended(self, j: int) -> None:
        p = self._pos
        p.ended.append(j)
        self._subs[j].close()
        if len(p.ended) == len(self.addresses):
            self._done = True
        else:
            p.next = self._live()[0] if p.next in p.ended else p.next

    def _name(self, j: int) -> str:
        return f"server {j} of {len(self.addresses)} ({self.addresses[j]!r})"

    def get_state(self) -> dict[str, Any] | None:
        """Every sub-stream's position after the last batch yielded: pass it as `state=` to a
        client with the same servers, in the same order, to continue exactly. None before the
        first batch of a fresh stream, as `BatchIterator.get_state()`."""
        p = self._pos
        if p.seq == 0 and all(s is None for s in p.streams) and not p.ended:
            return None
        return p.to_state(self.order)

    def close(self) -> None:
        """Cancels every sub-stream."""
        self._done = True
        for sub in self._subs:
            if sub is not None:
                sub.close()

    def __enter__(self) -> FanInIterator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
