"""The fuzz run's malicious servers against the client: a fake InputService
(`input_server.testing.attacks`'s HostileServer, answering GetInfo with this release's protocol) on
a Unix socket streams one valid [4, 128] batch, then a crafted one drawn by the seed: another shape,
dtype or byte count; renamed or missing tensors; segments past the row or counts not adding up; a
false `num_tokens`; more than 16 batches in a message or nested `following`; a state that is not
UTF-8, not an object, for another batch or over the bound; a message just over the client's receive
limit.

Issue 27: a client trusted its server (an 800 MB batch OOM-killed a trainer, float ids reached
the loop, raw ValueError / IndexError / UnicodeDecodeError). A finding is any outcome but a
`StreamError` with DATA_LOSS or RESOURCE_EXHAUSTED naming the socket within REFUSED_S, with
`get_state()` still the first batch's; in a fan-in of two, the error must start with
`server 1 of 2 (...)`.
"""

from __future__ import annotations

import json
import os
import random
import string
import time

import numpy as np
from fuzz_attacks import Finding

from input_client import InputClient, PipelineSpec, StreamError
from input_client._server_checks import expected_of
from input_client.proto import pb
from input_client.wire import MAX_BATCHES_PER_MESSAGE
from input_server.testing.attacks import (
    CRAFTED,
    SEQ_LEN,
    SIZE,
    HostileServer,
    batch,
    raw,
    with_state,
)
from input_server.testing.processes import serve_servicer

CASES, FAN_IN_CASES = 16, 4  # crafted batches against one server, and against a fan-in of two
REFUSED_S = 5.0
SPEC = PipelineSpec(
    source={"paths": ["x.jsonl"]},
    tokenizer={"model": "m.model"},
    batch={"seq_len": SEQ_LEN, "size": SIZE},
)
# A tensor's dtype: anything but the two an id travels as.
DTYPES = ["float32", "int64", "object", "float16", "int8", "uint32", "<i4", "V8", "", "int32 "]


def _dtype(rng: random.Random) -> str:
    if rng.random() < 0.7:
        return rng.choice(DTYPES)
    return "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 12)))


def mutation(rng: random.Random, seq: int, limit: int) -> tuple[str, pb.Batch]:
    """A crafted batch number `seq` of a [SIZE, SEQ_LEN] stream, and what it is."""
    kind = rng.choice(
        ["shape", "dtype", "bytes", "name", "segments", "counts", "num_tokens", "many", "nested"]
        + ["state", "over_limit"]
    )
    if kind == "shape":
        size, seq_len = rng.choice([(SIZE, SEQ_LEN + 1), (1, 1), (SIZE + 1, SEQ_LEN), (9, 4096)])
        return f"shape [{size}, {seq_len}]", batch(seq, size, seq_len)
    if kind == "dtype":
        dtype = _dtype(rng)
        data = bytes(SIZE * SEQ_LEN * 4)
        return f"dtype {dtype!r}", batch(seq, inputs=raw("inputs", dtype, [SIZE, SEQ_LEN], data))
    if kind == "bytes":
        n = rng.choice([0, 1, SIZE * SEQ_LEN * 4 - 1, SIZE * SEQ_LEN * 4 + 1, SIZE * SEQ_LEN * 8])
        return f"{n} bytes of ids", batch(
            seq, inputs=raw("inputs", "int32", [SIZE, SEQ_LEN], bytes(n))
        )
    if kind == "name":
        msg = batch(seq)
        t = rng.choice(msg.tensors)
        new = rng.choice(["", "inputs ", "targets", t.name.upper(), msg.tensors[0].name])
        label = f"tensor {t.name!r} named {new!r}"
        t.name = new if new != t.name else t.name + "_"
        return label, msg
    if kind == "segments":
        lengths = np.full(SIZE, SEQ_LEN, np.int32)
        lengths[rng.randrange(SIZE)] = SEQ_LEN + rng.randint(1, 1 << 20)
        return f"segment lengths {lengths.tolist()}", batch(seq, segment_lengths=lengths)
    if kind == "counts":
        counts = np.ones(SIZE, np.int32)
        counts[rng.randrange(SIZE)] = rng.choice([0, 2, 7, -1, 1 << 30])
        return f"segments per row {counts.tolist()}", batch(seq, segments_per_row=counts)
    if kind == "num_tokens":
        msg = batch(seq)
        msg.num_tokens = rng.choice([0, 1, SIZE * SEQ_LEN - 1, SIZE * SEQ_LEN + 1, -1, 2**62])
        return f"num_tokens {msg.num_tokens}", msg
    if kind == "many":
        msg = batch(seq)
        n = rng.randint(MAX_BATCHES_PER_MESSAGE, 4 * MAX_BATCHES_PER_MESSAGE)
        msg.following.extend(batch(seq + 1 + i) for i in range(n))
        return f"a message of {n + 1} batches", msg
    if kind == "nested":
        msg, inner = batch(seq), batch(seq + 1)
        inner.following.append(batch(seq + 2))
        msg.following.append(inner)
        return "nested following", msg
    if kind == "state":
        state = rng.choice(
            [
                rng.randbytes(rng.randint(1, 64)) + b"\xff",
                b"[2]",
                b"2",
                b"null",
                b'"x"',
                b'{"seq": 99}',
                b'{"seq": "2"}',
                json.dumps({"seq": seq + 1, "pad": "x" * (100 << 10)}).encode(),
            ]
        )
        return f"state {state[:40]!r}", with_state(seq, state)
    return f"a message of {limit + 1} bytes", batch(
        seq, inputs=raw("inputs", "int32", [50_000, 4096], bytes(limit + 1))
    )


def _judge(label: str, sock: str, outcome, took: float, state, prefix: str = "") -> list[Finding]:
    if not isinstance(outcome, StreamError):
        what = "accepted" if outcome is None else type(outcome).__name__
        return [("hostile server", label, what, str(outcome or "")[:300])]
    code, details = outcome.code.name, outcome.details or ""
    found = []
    if code not in ("DATA_LOSS", "RESOURCE_EXHAUSTED") or repr(sock) not in details:
        found.append(("hostile server", label, code, details[:300]))
    if prefix and not details.startswith(prefix):
        found.append(("fan-in names no member", label, code, details[:300]))
    if took > REFUSED_S:
        found.append(("hostile server refused late", label, code, f"{took:.1f} s"))
    if state is not None and state != {"seq": 1}:
        found.append(("state kept from a hostile server", label, code, str(state)[:300]))
    return found


def alone(folder: str, label: str, bad: pb.Batch) -> list[Finding]:
    sock = f"unix://{folder}/hostile.sock"
    outcome, took, state = None, 0.0, None
    try:
        with (
            serve_servicer(HostileServer([batch(0), bad]), sock),
            InputClient(sock, connect_timeout_s=10) as c,
            c.batches(SPEC, reconnect_deadline_s=30) as it,
        ):
            next(it)
            start = time.monotonic()
            try:
                next(it)
            except Exception as e:  # noqa: BLE001 - any exception is the outcome judged
                outcome = e
            took, state = time.monotonic() - start, it.get_state()
    except Exception as e:  # noqa: BLE001 - the first batch or the set-up failed
        return [("hostile server set-up", label, type(e).__name__, str(e)[:300])]
    return _judge(label, sock, outcome, took, state)


def fan_in(folder: str, label: str, bad: pb.Batch) -> list[Finding]:
    good, sock = f"unix://{folder}/good.sock", f"unix://{folder}/bad.sock"
    outcome, took = None, 0.0
    try:
        with (
            serve_servicer(HostileServer([batch(0), batch(1)]), good),
            serve_servicer(HostileServer([bad]), sock),
            InputClient([good, sock], connect_timeout_s=10) as c,
            c.batches(SPEC, reconnect_deadline_s=30) as it,
        ):
            next(it)  # server 0's first batch; server 1's is next in round robin
            start = time.monotonic()
            try:
                next(it)
            except Exception as e:  # noqa: BLE001
                outcome = e
            took = time.monotonic() - start
    except Exception as e:  # noqa: BLE001
        return [("hostile fan-in set-up", label, type(e).__name__, str(e)[:300])]
    return _judge(f"fan-in: {label}", sock, outcome, took, None, f"server 1 of 2 ({sock!r}): ")


def run_client(root: str, add, *, seed: int) -> dict:
    """CASES crafted batches (a third of them the tests' own CRAFTED ones) against one server,
    FAN_IN_CASES against a fan-in of two; each finding goes to `add`."""
    rng, start = random.Random(seed), time.monotonic()
    folder = os.path.join(root, "hostile-servers")
    os.makedirs(folder, exist_ok=True)
    limit = expected_of(SPEC.to_proto()).receive_limit
    for i in range(CASES):
        if i % 3 == 0:
            name = rng.choice(sorted(CRAFTED))
            label, bad = f"crafted {name}", CRAFTED[name][0]()
        else:
            label, bad = mutation(rng, 1, limit)
        for finding in alone(folder, label, bad):
            add(*finding)
    for _ in range(FAN_IN_CASES):
        label, bad = mutation(rng, 0, limit)
        for finding in fan_in(folder, label, bad):
            add(*finding)
    return {"malicious_server": round(time.monotonic() - start, 1)}
