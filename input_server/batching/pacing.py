"""A request's set-up work paced so that it cannot starve the streams already running.

Reading a resharded state (`batching.resharded`) costs CPU that a client chooses: up to about
0.8 s for the largest state the bounds admit, and any client may send it from many
calls at once. In one server process that work competes for the interpreter with every
running stream's packing and sending, so 8 such calls at once took a running stream from 187
to 38 batches/s. Here each request's set-up runs free for a short grace (every honest state
of a few hundred old hosts reads within it), then waits its turn (one paced request at a
time) and runs at a bounded share of one core, within a CPU budget of its own checked before
each unit of work.

The waiting requests are queued fairly, as a fair-queueing router shares one buffer among its
flows: each belongs to a peer, and within the peer to a client (`caller`). Turns go to the
peer served least recently, then within it to its client served least recently, then to the
oldest request; when every waiting place is taken, a newcomer takes the newest place of the
peer (then client) holding the most, if that holds two more than the newcomer's own (so that
equals never take places from each other), and is refused otherwise. So one peer's flood
neither keeps another peer's request out nor puts it at the back of the flood.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator

from input_client.wire import SETUP_QUEUE_FULL as QUEUE_FULL  # the client retries on it
from input_server import cancel
from input_server.errors import OverBudgetError
from input_server.plurals import plural

# Module-level aliases: tests give the pacer other clocks.
thread_time = time.thread_time
sleep = time.sleep
WAIT_POLL_S = 1.0

# Whom a request's set-up work belongs to: (peer, client within the peer).
Key = tuple[str, str]


class _Caller(threading.local):
    """This thread's `caller` block's key (None outside one)."""

    key: Callable[[], Key] | None = None


_local = _Caller()
_calls = itertools.count()


@contextlib.contextmanager
def caller(key: Callable[[], Key]) -> Iterator[None]:
    """Within the block, set-up work this thread does is `key()`'s: its peer (whom the server
    can tell apart) and its client within that peer. `key` is called only if the work has to
    wait for its turn. Outside a block, each request is a peer of its own.
    """
    outer = _local.key
    _local.key = key
    try:
        yield
    finally:
        _local.key = outer


def _own_key() -> Key:
    """The key of work outside `caller`: a peer of its own (tests, the CLI)."""
    return f"call {next(_calls)}", ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PaceConfig:
    """How set-up work beyond its grace is paced.

    Attributes:
      grace_s: CPU seconds a request's set-up takes before it is paced (4 old hosts' state
        reads in about 4 ms here, 64 hosts' of a 16-component mixture in about 20 ms); 8
        forged states at once take 8 graces unpaced.
      share: the fraction of wall time a paced request may compute (1/20: the largest state
        the bounds admit, 0.6 s of CPU, reads in 12 s, and a running stream keeps about 0.9
        of its rate; at 1/10 it kept 0.56-1.03 on this loaded 2-core host).
      slice_s: CPU a paced request computes between its pauses (a few ms: the interpreter's
        own switch interval is 5 ms).
      budget_s: the most CPU one request's set-up may take; checked before each unit of
        work (the largest state the bounds admit took 0.6-0.8 s here).
      max_waiting: requests that may wait for their turn, shared fairly between peers (see
        the module's docstring); more are refused.
    """

    grace_s: float = 0.01
    share: float = 0.05
    slice_s: float = 0.005
    budget_s: float = 5.0
    max_waiting: int = 16

    def __post_init__(self):
        if not 0 < self.share <= 1:
            raise ValueError(f"`share` must be in (0, 1], got {self.share}.")
        if self.grace_s < 0 or self.slice_s <= 0 or self.budget_s <= 0:
            raise ValueError(
                f"`grace_s`, `slice_s` and `budget_s` must be positive, got {self.grace_s}, "
                f"{self.slice_s} and {self.budget_s}."
            )
        if self.max_waiting < 0:
            raise ValueError(f"`max_waiting` must be at least 0, got {self.max_waiting}.")


class Gate:
    """One paced request at a time; the others wait in a queue fair between peers."""

    def __init__(self, config: PaceConfig = PaceConfig()):
        self.config = config
        self._cond = threading.Condition()
        self._waiting: list[_Pacer] = []  # in the order they came
        self._holder: _Pacer | None = None
        # The turn at which each peer, and each (peer, client), was last served: the next
        # turn goes to the one served longest ago. Only those waiting or holding are kept.
        self._served: dict[object, int] = {}
        self._turns = itertools.count()
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn now."""
        with self._cond:
            return len(self._waiting)

    @contextlib.contextmanager
    def work(self, what: str) -> Iterator[Callable[[], None]]:
        """Within the block, call the function it gives between units of `what`'s work: it
        returns at once within the grace, then takes the request's turn and paces it.

        Raises (from that function):
          OverBudgetError: the request's set-up passed `budget_s` of CPU, or its peer holds
            its share of a full queue (or gave a place up to another peer's request).
          CancelledError: the client left (`cancel.scope`).
        """
        pacer = _Pacer(self, what, _local.key or _own_key)
        try:
            yield pacer.pace
        finally:
            self._leave(pacer)

    def enter(self, pacer: _Pacer) -> None:
        """Makes `pacer` the one paced request, waiting its turn; refuses it when its peer holds
        its share of a full queue, or when it gives its place up meanwhile."""
        with self._cond:
            pacer.arrival = next(self._arrivals)
            if self._holder is None and not self._waiting:
                self._grant(pacer)
                return
            if len(self._waiting) >= self.config.max_waiting:
                self._make_room(pacer)
            self._waiting.append(pacer)
            try:
                while self._holder is not pacer:
                    if pacer.refusal is not None:
                        raise OverBudgetError(pacer.refusal)
                    # Woken when the turn passes or a place is taken; else once a second, to
                    # see whether its client left (each wake-up takes the interpreter from the
                    # running streams: 8 waiters polling 10 times a second cost one 10 % of
                    # its rate).
                    self._cond.wait(WAIT_POLL_S)
                    cancel.check()  # a client that left gives its place up
            except BaseException:
                if pacer in self._waiting:
                    self._waiting.remove(pacer)
                    self._forget()
                raise  # a turn given meanwhile passes on as `work` leaves

    def _make_room(self, pacer: _Pacer) -> None:
        """Frees a place for `pacer` in the full queue by refusing another peer's (or client's)
        newest request, or refuses `pacer`."""
        victim = self._victim(pacer.key)
        if victim is None:
            peer = sum(p.key[0] == pacer.key[0] for p in self._waiting)
            own = sum(p.key == pacer.key for p in self._waiting)
            waiting = plural(len(self._waiting), "request")
            raise OverBudgetError(
                f"{pacer.what}: {QUEUE_FULL} ({waiting} waiting to set up large resumed "
                f"states, {peer} of them from this peer and {own} from this client; places "
                f"are shared fairly between peers, then between a peer's clients); retry later."
            )
        self._waiting.remove(victim)
        victim.refusal = (
            f"{victim.what}: {QUEUE_FULL}: this request gave its place to one of a peer (or "
            f"client) holding fewer of the {self.config.max_waiting} places; retry later."
        )
        self._cond.notify_all()

    def _victim(self, key: Key) -> _Pacer | None:
        """The waiting request that gives its place to a newcomer of `key`: the newest of the
        peer holding the most places, if that holds two more than `key`'s peer; else, within
        `key`'s peer, the newest of the client holding the most, on the same terms."""
        pool = self._waiting
        for depth in (1, 2):
            counts = collections.Counter(p.key[:depth] for p in pool)
            if not counts:
                return None
            top = max(counts, key=counts.__getitem__)
            if counts[top] >= counts[key[:depth]] + 2:
                heavy = [p for p in pool if p.key[:depth] == top]
                # Within the peer that gives a place up, its busiest client gives it.
                clients = collections.Counter(p.key for p in heavy)
                busiest = max(clients, key=clients.__getitem__)
                return [p for p in heavy if p.key == busiest][-1]
            pool = [p for p in pool if p.key[:depth] == key[:depth]]
        return None

    def _grant(self, pacer: _Pacer) -> None:
        self._holder = pacer
        turn = next(self._turns)
        self._served[pacer.key[0]] = self._served[pacer.key] = turn

    def _leave(self, pacer: _Pacer) -> None:
        with self._cond:
            if self._holder is not pacer:
                return
            self._holder = None
            if self._waiting:
                served = self._served
                nxt = min(
                    self._waiting,
                    key=lambda p: (served.get(p.key[0], -1), served.get(p.key, -1), p.arrival),
                )
                self._waiting.remove(nxt)
                self._grant(nxt)
            self._forget()
            self._cond.notify_all()

    def _forget(self) -> None:
        """Drops the turns of peers and clients that neither wait nor hold: the map stays as
        small as the queue."""
        present = [*self._waiting, *([self._holder] if self._holder else [])]
        keep = {k for p in present for k in (p.key[0], p.key)}
        for k in [k for k in self._served if k not in keep]:
            del self._served[k]


class _Pacer:
    """One request's set-up: its CPU so far, whom it belongs to, and whether it holds the gate."""

    def __init__(self, gate: Gate, what: str, key: Callable[[], Key]):
        self.gate, self.what = gate, what
        self._key = key
        self.key: Key = ("", "")  # asked for once it waits
        self.arrival = 0
        self.refusal: str | None = None  # why it gave its place up, while waiting
        self.start = self.mark = thread_time()
        self.held = False

    def pace(self) -> None:
        cancel.check()
        config = self.gate.config
        now = thread_time()
        used = now - self.start
        if used > config.budget_s:
            raise OverBudgetError(
                f"{self.what} took over {config.budget_s:g} s of the server's CPU, the most a "
                f"request's set-up may take: resume on fewer old hosts' states."
            )
        if used < config.grace_s:
            return
        if not self.held:
            self.key = self._key()  # outside the gate's lock: it may read the kernel's tables
            self.gate.enter(self)
            self.held = True
            self.mark = thread_time()
            return
        burst = now - self.mark
        if burst >= config.slice_s:
            sleep(burst * (1 / config.share - 1))
            self.mark = thread_time()


# The server's one gate: set-up work from every request shares it.
GATE = Gate()
