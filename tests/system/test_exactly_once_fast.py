"""Exactly once across a SIGKILL of `input-server serve` while a fast tokenizer backend serves and
the token cache is on, and across a SIGKILL in the middle of a resharded stream (issue 39, item
8). Real server processes on Unix sockets, real Grain, a real tiktoken model (fastokens serves
it); every batch is compared, byte for byte, with an uninterrupted run of the same spec on a
server without the cache whose reference library tokenizes."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter

import numpy as np
import pytest

from input_client import InputClient, PipelineSpec, reshard
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.token_cache import TokenCache
from input_server.data.tokenizers.trainers import write_tiktoken_model
from tests.support import ChildProcess, ServerProcess, assert_same_batches, cli_argv

DOCS = 900


@pytest.fixture(scope="module")
def world(docs, tmp_path_factory) -> dict:
    """Real documents and a tiktoken model trained on some of them, in one data root."""
    folder = tmp_path_factory.mktemp("exactly-once-fast")
    return {
        "root": str(folder),
        "data": write_jsonl(docs[:DOCS], folder / "docs.jsonl"),
        # Ranks of this file alone (its vocabulary): fastokens' own loader takes them.
        "model": write_tiktoken_model(docs[:300], folder / "m.tiktoken", vocab_size=700),
    }


class _Verbose(ServerProcess):
    """`input-server -v serve`: its log holds each stream's `stream_open` line (who tokenizes,
    whether the token cache serves it)."""

    def start(self) -> None:
        root = ("--data-root", self.data_root) if self.data_root else ()
        self.child = ChildProcess(
            cli_argv("-v", "serve", "--listen", self.address, *root, *self.args),
            log=self.log_path,
        )


@pytest.fixture
def servers(short_tmp, world):
    """`servers(name, *flags)`: a started `input-server -v serve` of the data root on
    `short_tmp`/NAME.sock, its derived tokenizer files kept in `short_tmp` (not the user's
    cache); all are SIGKILLed at the end."""
    started = []

    def make(name: str, *flags: str) -> ServerProcess:
        srv = _Verbose(
            f"unix://{short_tmp}/{name}.sock",
            str(short_tmp / f"{name}.log"),
            data_root=world["root"],
            args=("--tokenizer-cache", str(short_tmp / f"{name}-tokenizers"), *flags),
        )
        started.append(srv)
        srv.start()
        return srv

    yield make
    for srv in started:
        srv.kill()


def _copy(batch: dict) -> dict:
    return {k: np.array(v, copy=True) for k, v in batch.items()}


def _newest(client: InputClient):
    """The newest stream's info (a broken stream's may linger a moment)."""
    return max(client.info().streams, key=lambda s: s.stream_id)


def _reference(spec: PipelineSpec, srv: ServerProcess, *, state=None, take=None) -> list[dict]:
    """The uninterrupted run: `spec` from `state` tokenized by the reference library, on a
    server without the token cache; all its batches, or the first `take`."""
    spec = spec.replace(tokenizer={"backend": "reference"})
    out = []
    with InputClient(srv.address, connect_timeout_s=60) as client:
        with client.batches(spec, state=state) as it:
            for batch in it:
                if not out:
                    assert _newest(client).tokenizer_backend == "reference"
                out.append(_copy(batch))
                if len(out) == take:
                    break
    return out


def _log_lines(srv: ServerProcess, needle: str) -> list[str]:
    with open(srv.log_path, errors="replace") as f:
        return [line for line in f if needle in line]


def _stream_of(client: InputClient, backend: str):
    """The info of the server's stream that `backend` tokenizes (one such stream runs)."""
    (info,) = [s for s in client.info().streams if s.tokenizer_backend == backend]
    return info


BACKENDS = {"fast": "fastokens", "cached": "reference"}  # the two streams' tokenizers


@pytest.mark.parametrize("processes", [0, 1, "auto"])
def test_sigkill_with_fastokens_and_the_token_cache_is_exactly_once(
    servers, world, short_tmp, processes
):
    """Two streams of one spec on a server with `--token-cache`: one served by fastokens (the
    cache is not used: it keeps only the reference library's ids), one asking for the
    reference (the cache keeps its ids). In the second epoch, with the first epoch's ids in the
    cache, the server is SIGKILLed and started again on the same socket and cache folder; both
    clients reconnect by themselves and resume after the last batch they took. Every batch of
    both equals the uninterrupted reference run's (a server without the cache), none lost, none
    repeated; after the restart fastokens serves again, and the reference's stream reads every
    group back from what the first server cached (it tokenizes nothing). In the server, or in a
    worker process of each stream (which the SIGKILL of the server's process group takes too,
    and which opens the cache itself); or as many as "auto" chose."""
    cache = short_tmp / "cache"
    fast = servers("fast", "--token-cache", str(cache))
    ref = servers("ref")
    spec = PipelineSpec(
        source={"paths": [world["data"]]},
        tokenizer={"model": world["model"], "kind": "tiktoken"},
        batch={"seq_len": 256, "size": 4},
        order={"seed": 5, "epochs": 0},
        workers={"count": processes},
    )
    cached = spec.replace(tokenizer={"backend": "reference"})
    got: dict[str, list[dict]] = {"fast": [], "cached": []}
    killed_at = after = None
    with (
        InputClient(fast.address, connect_timeout_s=60) as client,
        client.batches(spec, reconnect_deadline_s=60) as a,
        client.batches(cached, reconnect_deadline_s=60) as b,
    ):
        its = {"fast": a, "cached": b}
        while after is None or after > 0:
            for name, it in its.items():
                got[name].append(_copy(next(it)))
            if killed_at is None:
                # Both in the second epoch: the first epoch's ids are in the cache.
                if min(it.get_state()["doc"] for it in its.values()) > DOCS + 50:
                    assert _stream_of(client, "fastokens") and _stream_of(client, "reference")
                    fast.kill()  # SIGKILL, the server's whole process group
                    killed_at = len(got["fast"])
                    # Every document of the first epoch, once (the reference's stream's).
                    kept = TokenCache(str(cache), 1 << 30)
                    assert kept.stats()["entries"] == DOCS
                    kept.close()
                    fast.start()  # on the same socket and cache folder
            elif after is None and a.reconnects and b.reconnects:
                after = 30  # batches of the restarted server's streams
            elif after is not None:
                after -= 1
            assert len(got["fast"]) < 2000, "the kill never broke both streams"
        restarted = {name: _stream_of(client, backend) for name, backend in BACKENDS.items()}
        for name, it in its.items():
            assert it.reconnects == 1, name  # the kill was felt by both
            assert it.get_state()["seq"] == len(got[name])
    print(f"killed after batch {killed_at}; {len(got['fast'])} batches")
    want = _reference(spec, ref, take=len(got["fast"]))
    assert_same_batches(got["fast"], want)
    assert_same_batches(got["cached"], want)
    # Who tokenized, and whether the cache served, on each start (`stream_open` lines).
    opened = _log_lines(fast, "token cache")
    assert len(opened) == 4, opened
    counted = r"\d+" if processes == "auto" else str(processes)  # "auto": what it chose
    assert all(re.search(rf": {counted} worker processes,", x) for x in opened), opened
    assert sum("tokenized by fastokens; token cache not used: fastokens" in x for x in opened) == 2
    assert sum("tokenized by reference; token cache used" in x for x in opened) == 2
    # The restarted reference stream read every group from the first server's cache.
    stages = {s.stage: s.seconds for s in restarted["cached"].stats.stages}
    assert stages["tokenize"] == 0.0 and stages["read"] > 0, stages
    fast_stages = {s.stage: s.seconds for s in restarted["fast"].stats.stages}
    assert fast_stages["tokenize"] > 0, fast_stages


def _marked_spec(world, shard) -> PipelineSpec:
    """Whole documents, one a segment (first_fit, trimmed to seq_len), so each segment of a
    batch names its document."""
    return PipelineSpec(
        source={"paths": [world["data"]]},
        tokenizer={"model": world["model"], "kind": "tiktoken"},
        batch={"seq_len": 128, "size": 4, "packing": "first_fit", "long_documents": "trim"},
        order={"seed": 11, "epochs": 1},
        shard={"index": shard[0], "count": shard[1]},
        workers={"count": 0},
    )


def _segments(batches) -> list[tuple[int, ...]]:
    """Each document's tokens in the batches (one segment a document)."""
    out = []
    for b in batches:
        inputs, seg = np.asarray(b["inputs"]), np.asarray(b["inputs_segmentation"])
        for row, ids in zip(inputs, seg, strict=True):
            for s in np.unique(ids[ids > 0]):
                out.append(tuple(row[ids == s].tolist()))
    return out


def test_sigkill_in_a_resharded_stream_reads_every_dealt_document_once(servers, world, short_tmp):
    """Three hosts read part of an epoch; their states are resharded onto two. The two new
    hosts stream at once from the server with the token cache, new host 0 served by fastokens,
    new host 1 by the reference (whose ids the cache keeps); the server is SIGKILLed in the
    middle of their dealt documents and restarted, and both clients resume by themselves. Each
    new host's batches equal the uninterrupted run from its resharded state, byte for byte; over
    the old hosts' batches and the new ones', every document of the epoch is read exactly once."""
    fast = servers("fast", "--token-cache", str(short_tmp / "cache"))
    ref = servers("ref")
    old_count, new_count = 3, 2
    got_docs: list[tuple[int, ...]] = []
    states = []
    with InputClient(ref.address, connect_timeout_s=60) as client:
        for i, take in zip(range(old_count), [5, 9, 3], strict=True):
            with client.batches(_marked_spec(world, (i, old_count))) as it:
                old = [_copy(next(it)) for _ in range(take)]
                states.append(json.loads(json.dumps(it.get_state())))
            got_docs += _segments(old)
    dealt = reshard(states, new_count)
    specs = [_marked_spec(world, (j, new_count)) for j in range(new_count)]
    specs[1] = specs[1].replace(tokenizer={"backend": "reference"})
    got: list[list[dict]] = [[], []]
    killed = False
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(InputClient(fast.address, connect_timeout_s=60))
        its = [
            stack.enter_context(client.batches(spec, state=state, reconnect_deadline_s=60))
            for spec, state in zip(specs, dealt, strict=True)
        ]
        open_ = list(its)
        while open_:
            for j, it in enumerate(its):
                if it not in open_:
                    continue
                batch = next(it, None)
                if batch is None:
                    open_.remove(it)
                    continue
                got[j].append(_copy(batch))
            if min(len(g) for g in got) == 8 and not killed:
                assert _stream_of(client, "fastokens") and _stream_of(client, "reference")
                assert all("elastic" in it.get_state() for it in its), "past the dealt set"
                fast.kill()  # SIGKILL, in the middle of both resharded streams
                fast.start()
                killed = True
        for j, it in enumerate(its):
            assert it.reconnects == 1, f"new host {j} did not feel the kill"
            assert it.get_state()["seq"] == dealt[j]["seq"] + len(got[j])
    for j, spec in enumerate(specs):
        want = _reference(spec, ref, state=dealt[j])
        assert len(got[j]) > 20
        assert_same_batches(got[j], want)
        got_docs += _segments(got[j])
    whole = _reference(_marked_spec(world, (0, 1)), ref)
    want_docs = _segments(whole)
    assert len(want_docs) == DOCS  # one segment a document
    assert Counter(got_docs) == Counter(want_docs), "documents read twice or skipped"
    said = "resharded: share {} of 2 of what 3 old streams left"
    for j in range(new_count):  # before the kill and after
        assert len(_log_lines(fast, said.format(j))) == 2, _log_lines(fast, "resharded")
