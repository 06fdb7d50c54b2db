"""Elastic resume: the states of a run's `c` hosts, made into states for `count` new hosts.

Host `i` of `c` reads shard `i` of `c` (records `i + k·c`, in its own order each epoch), and
its state says where it stands there. Those states cannot resume on another host count as
they are: every shard changes. `reshard` writes, for each new host, a state that names the
old layout (every old host's state, as it was) and the new host's share of it; the server
computes from it which documents the new host reads (`input_server.data.elastic`):

- every document of every epoch some old host had begun that no old host had used is dealt
  to the new hosts in turn (a document an old host had partly used comes first, from the
  token it had reached);
- later epochs are sharded by the new count, as a fresh run of that count would shard them.

So across the change every document of every epoch is delivered exactly once. The new
states hold the old ones (their size grows with the old host count, not with documents).
A fanned-in state (`fanin`) holds one state a server, each for a sub-shard of the host's
shard; those are resharded alike, and a host can also change only its number of servers
(`reshard_servers`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

# The key a fanned-in state holds its sub-streams under (`fanin` names it STATE_KEY: it
# imports this module, so the name lives here), and a resharded state its old states.
FAN_IN = "fan_in"
ELASTIC = "elastic"
# A new state holds every old state; the server reads requests of at most 4 MiB.
MAX_STATE_BYTES = 2 << 20
# Old streams a resharded state may name over all its levels (a state resharded again before
# its host read what it was dealt holds the earlier ones too), and new streams one may share
# among: the server refuses more (`input_server.batching.resharded`).
MAX_STREAMS = 4096


def reshard(states: Sequence[dict[str, Any] | None], count: int) -> list[dict[str, Any] | None]:
    """The states of `count` new hosts that continue the run whose `c` hosts saved `states`.

    Args:
      states: every old host's `get_state()`, in host order (`states[i]` is host i's, of
        shard `i` of `c = len(states)`; None for a host that took no batch). Plain or fanned
        in (then all fanned in from the same number of servers), for one spec.
      count: the new host count; new host `j` resumes from the result's `[j]` with its spec's
        `shard.index` j and `shard.count` `count` (and, fanned in, as many servers as
        before: each sub-stream gets its own state).

    Raises:
      ValueError: naming the state that does not fit: from another spec or seed, a host's
        state missing, given twice or out of place, another host count, a state this
        server version never wrote.
    """
    if type(count) is not int or count < 1:
        raise ValueError(f"`count` must be a positive integer, got {count!r}.")
    states = list(states)
    if not states:
        raise ValueError("`states` is empty: pass every old host's get_state(), in host order.")
    if all(s is None for s in states):
        return [None] * count  # nobody began: a fresh run on the new count
    servers = _servers(states)
    c = len(states)
    entries = []
    for k in range(servers):  # sub-shard i + c·k of c·servers: host i's server k
        for i, s in enumerate(states):
            sub = s if servers == 1 or s is None else _sub_states(s, i, servers)[k]
            entries.append(_entry(sub, i + c * k, c * servers, f"states[{i}]", k, servers))
    _same_run(entries)
    if not any("run" in e for e in entries):
        return [None] * count  # no stream took a batch: a fresh run on the new count
    _check_streams(entries, count * servers)
    seq = max((s.get("seq", 0) for s in states if s is not None), default=0)
    out: list[dict[str, Any] | None] = []
    for j in range(count):
        subs = [_new_state(entries, j + count * k, count * servers, seq) for k in range(servers)]
        out.append(subs[0] if servers == 1 else _fan_in(states, subs, seq))
    _check_size(out)
    return out


def reshard_servers(state: dict[str, Any], servers: int) -> dict[str, Any] | None:
    """One host's state (fanned in from N servers, or one server's) continued on `servers`
    servers (1: one server's state): the host's shard stays, its sub-shards change
    (`fanin.sub_shard`: host shard i of c on N servers reads shards i + c·k of c·N)."""
    if type(servers) is not int or servers < 1:
        raise ValueError(f"`servers` must be a positive integer, got {servers!r}.")
    n = _servers([state])
    subs = _sub_states(state, None, n) if n > 1 or FAN_IN in state else [state]
    shards = [s["shard"] for s in subs if isinstance(s, dict) and "run" in s]
    if not shards:  # no sub-stream took a batch: the host's start on any number of servers
        return None
    index, total = _shard_of(shards[0], "state")
    c = total // n
    i = index % c
    entries = [_entry(s, i + c * k, c * n, "state", k, n) for k, s in enumerate(subs)]
    _same_run(entries)
    _check_streams(entries, servers)
    seq = int(state.get("seq", 0))
    new = [
        _new_state(entries, k, servers, seq, shard=(i + c * k, c * servers)) for k in range(servers)
    ]
    out = new[0] if servers == 1 else _fan_in([state], new, seq)
    _check_size([out])
    return out


def _servers(states: Sequence[dict[str, Any] | None]) -> int:
    """The servers the states were fanned in from (1: plain), the same for all."""
    kinds = set()
    for i, s in enumerate(states):
        if s is None:
            continue
        if not isinstance(s, dict):
            raise ValueError(f"`states[{i}]` is a {type(s).__name__}, not a get_state() result.")
        fan = s.get(FAN_IN)
        kinds.add(fan.get("servers") if isinstance(fan, dict) else 1)
    if len(kinds) > 1:
        raise ValueError(
            f"`states` were fanned in from different numbers of servers "
            f"({sorted(map(str, kinds))}): not the states of one run."
        )
    n = kinds.pop()
    if type(n) is not int or n < 1:
        raise ValueError(f"a state's 'fan_in' names {n!r} servers: not a get_state() result.")
    return n


def _sub_states(state: dict[str, Any], i: int | None, n: int) -> list[dict[str, Any] | None]:
    fan = state.get(FAN_IN)
    where = "state" if i is None else f"states[{i}]"
    streams = fan.get("streams") if isinstance(fan, dict) else None
    if not isinstance(streams, list) or len(streams) != n:
        raise ValueError(f"`{where}['fan_in']` needs 'streams', a list of {n} states.")
    return streams


def _shard_of(shard: Any, where: str) -> tuple[int, int]:
    ok = isinstance(shard, list) and len(shard) == 2 and all(type(x) is int for x in shard)
    if not ok or not 0 <= shard[0] < shard[1]:
        raise ValueError(f"`{where}` names shard {shard!r}: not a get_state() result.")
    return shard[0], shard[1]


def _entry(
    s: dict[str, Any] | None, index: int, total: int, where: str, k: int, servers: int
) -> dict[str, Any]:
    """An old stream's state as the new states hold it, checked to be shard `index` of
    `total` (a stream that took no batch: just its shard)."""
    if servers > 1:
        where = f"{where}['fan_in']['streams'][{k}]"
    if s is None:
        return {"shard": [index, total]}
    if not isinstance(s, dict):
        raise ValueError(f"`{where}` is a {type(s).__name__}, not a get_state() result.")
    if "run" not in s or "shard" not in s:
        raise ValueError(
            f"`{where}` names no shard: written by a server from before elastic resume. "
            f"Resume it on its own host count; states written after that reshard."
        )
    got = _shard_of(s["shard"], where)
    if got[1] != total:
        raise ValueError(
            f"`{where}` is the state of shard {got[0]} of {got[1]}, but the states given "
            f"make {total} shards{_fanned(servers)}: pass every old host's state, no more "
            f"and no fewer."
        )
    if got[0] != index:
        raise ValueError(
            f"`{where}` is shard {got[0]}'s state, in shard {index}'s place: a host's state "
            f"given twice or out of place (pass them in host order)."
        )
    return {key: v for key, v in s.items() if key != "version"}


def _fanned(servers: int) -> str:
    return f" ({servers} servers each)" if servers > 1 else ""


def _same_run(entries: list[dict[str, Any]]) -> None:
    runs = {}
    for e in entries:
        if "run" in e:
            runs.setdefault(e["run"], e["shard"])
    if len(runs) > 1:
        (a, sa), (b, sb) = list(runs.items())[:2]
        raise ValueError(
            f"the states of shards {sa} and {sb} are from different specs or seeds (data "
            f"fingerprints {a!r} and {b!r}): reshard the states of one run."
        )


def _new_state(
    entries: list[dict[str, Any]],
    deal: int,
    of: int,
    seq: int,
    *,
    shard: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The state of new stream `deal` of `of` (its shard, unless another is given)."""
    run = next(e["run"] for e in entries if "run" in e)
    index, total = shard or (deal, of)
    return {
        "version": 1,
        "run": run,
        "shard": [index, total],
        "seq": seq,
        "doc": 0,
        "offset": 0,
        ELASTIC: {"deal": [deal, of], "from": entries},
    }


def _fan_in(
    states: Sequence[dict[str, Any] | None], subs: list[dict[str, Any] | None], seq: int
) -> dict[str, Any]:
    fans = [s[FAN_IN] for s in states if s is not None and FAN_IN in s]
    order = fans[0].get("order", "round_robin") if fans else "round_robin"
    return {
        "seq": seq,
        FAN_IN: {"servers": len(subs), "order": order, "next": 0, "ended": [], "streams": subs},
    }


def _streams_in(entries: list[dict[str, Any]]) -> int:
    """Old streams the entries name, those of states resharded earlier included."""
    nested = [e.get(ELASTIC, {}).get("from", []) for e in entries]
    return len(entries) + sum(_streams_in(x) for x in nested if x)


def _check_streams(entries: list[dict[str, Any]], new: int) -> None:
    if new > MAX_STREAMS:
        raise ValueError(
            f"{new} new streams: a run reshards onto at most {MAX_STREAMS} (hosts x servers)."
        )
    old = _streams_in(entries)
    if old > MAX_STREAMS:
        raise ValueError(
            f"the states name {old:,} old streams in all (over {MAX_STREAMS:,}): some were "
            f"resharded before and their hosts have not read what that change dealt them. "
            f"Resume on the last host count until they have (their states then hold no old "
            f"ones), then reshard."
        )


def _check_size(states: list[dict[str, Any] | None]) -> None:
    for s in states:
        size = len(json.dumps(s, separators=(",", ":")))
        if size > MAX_STATE_BYTES:
            raise ValueError(
                f"a resharded state would be {size:,} bytes (over {MAX_STATE_BYTES:,}): too "
                f"many old hosts, or states resharded again before their hosts left the "
                f"documents an earlier change dealt them. Resume on the old count until then."
            )
