"""Fuzz run: hostile requests against a real server, which must answer each by the contract.

  python scripts/fuzz.py [--seed 0] [--requests 300] [--max-seconds 60] [--deadline-s 3]
                         [--server unix:///path.sock [--server-pid PID]] [--max-rss-mb 3072]

Four kinds of request, drawn by a seeded generator: random bytes as the raw request; a valid
request's bytes with bits flipped, cut or spliced; well-formed protos with hostile values in
their fields (huge and negative numbers, odd unicode, `../` and `/proc` paths, globs, a FIFO, links
out of the data root, a garbage model); a real stream's resume state tampered with (JSON edits,
Infinity, NaN, huge ints, deep nesting, bytes that are not UTF-8). Each call has a deadline and
reads at most a few messages, so the run is bounded by `--requests` and `--max-seconds`.

Without `--server` it builds a corpus in every file format, a sentencepiece model and the
hostile files in a temporary folder, and serves that folder (`serve --data-root`) on a Unix
socket there. Findings: a status outside README's table (UNKNOWN included), INTERNAL, a
traceback on the wire, a call that outlives its deadline, an unreadable batch, the server dying
or leaving SERVING, its RSS more than 10 % above its level after the warm-up, streams or worker
processes left behind, a valid stream failing at the end. Prints JSON; exits 1 on any finding.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import psutil

# The repository root, so that `python scripts/fuzz.py` imports the shared helpers from any folder.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from input_client.proto import pb  # noqa: E402
from input_client.wire import MESSAGE_OPTIONS, PROTOCOL_VERSION  # noqa: E402
from tests.support import ChildProcess, cli_argv, health, write_format  # noqa: E402

METHOD = "/input_server.v1.InputService/StreamBatches"
# README's status table, plus what a client's own deadline or cancel produces.
CONTRACT = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "DATA_LOSS",
            "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "UNAVAILABLE", "UNAUTHENTICATED",
            "CANCELLED", "DEADLINE_EXCEEDED"}
SERVING = 1
# Every reader once in the warm-up: lazily imported readers (pyarrow, array_record) grow RSS once,
# which is not a leak.
FORMATS = ("jsonl-plain", "jsonl-zst", "jsonl-gz-text_field-body", "parquet-row-groups",
           "arrayrecord-text")
RSS_TOLERANCE = 0.10


# --- the data the server serves, and files no request may get at ---------------------------------

def build_data(root: str) -> dict:
    """A corpus in every format, its model, and hostile files; returns their paths."""
    from input_server.tools.corpus import stdlib_docstrings, train_sentencepiece

    docs = stdlib_docstrings(300)
    model = train_sentencepiece(docs, os.path.join(root, "spm"), vocab_size=1000)
    sources = [write_format(kind, docs, os.path.join(root, kind))[1] for kind in FORMATS]
    bad = os.path.join(root, "hostile")
    os.makedirs(os.path.join(bad, "dir.jsonl"))
    os.mkfifo(os.path.join(bad, "fifo.jsonl"))  # opening it blocks until a writer comes
    for name, target in [("passwd.jsonl", "/etc/passwd"), ("zero.jsonl", "/dev/zero"),
                         ("mem.model", "/proc/self/mem"), ("up.jsonl", "..")]:
        os.symlink(target, os.path.join(bad, name))
    rng = random.Random(0)
    with open(model, "rb") as f:
        good = f.read()
    for name, data in [("empty.jsonl", b""), ("noise.jsonl", rng.randbytes(4096)),
                       ("noise.model", rng.randbytes(4096)), ("half.model", good[:len(good) // 2]),
                       ("empty.model", b""), ("nul.jsonl", b'{"text": "a\\u0000b"}\n\x00\n')]:
        with open(os.path.join(bad, name), "wb") as f:
            f.write(data)
    hostile = sorted(os.path.join(bad, n) for n in os.listdir(bad))
    return {"root": root, "model": model, "sources": sources, "hostile": hostile}


def string_pool(data: dict) -> list[str]:
    root = data["root"]
    return ["", " ", "*", "**/*", "[", "?", "~", ".", "..", "../" * 8 + "etc/passwd",
            root + "/../../etc/shadow", "/proc/self/environ", "/proc/self/mem", "/dev/zero",
            "/dev/stdin", "/etc/passwd", "/", root, root + "/*/*", root + "/**/*", "\x00",
            "a\x00b", "\u202e", "e\u0301", "\U0001F600" * 3, "\ufeff", "\u0663", "\u00b2",
            "\uff11", "\u0130", "auto", "0", "1", "2", "3", "-1", "1024", "1e309", "nan", "inf",
            "9" * 5000, "x" * 100_000, "%s%n%x", "${HOME}", "$(id)", "\n", "jsonl", "parquet",
            "arrayrecord", "json", "text", "tf_example", "first_fit", "concat_then_split",
            "none", "body", *data["hostile"], *[s["paths"][0] for s in data["sources"]],
            data["model"]]


# --- requests ------------------------------------------------------------------------------------

def valid_request(rng: random.Random, data: dict, source: dict | None = None
                  ) -> pb.StreamBatchesRequest:
    src = source or rng.choice(data["sources"])
    spec = pb.PipelineSpec(
        source=pb.Source(**src), tokenizer=pb.Tokenizer(model=data["model"], add_bos=True),
        batch=pb.BatchShape(seq_len=rng.choice([16, 64, 128]), size=rng.choice([1, 2, 4]),
                            packing=rng.choice(["first_fit", "concat_then_split", "none"])),
        order=pb.Order(seed=rng.randrange(100), shuffle=rng.random() < 0.5, epochs=1),
        shard=pb.Shard(index=0, count=1), workers=pb.Workers(count="0"))
    return pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)


def random_string(rng: random.Random, pool: list[str]) -> str:
    roll = rng.random()
    if roll < 0.7:
        return rng.choice(pool)
    if roll < 0.85:
        return "/".join(rng.choice(pool) for _ in range(rng.randint(2, 4)))
    # Any code point but the surrogates, which a proto string cannot carry.
    return "".join(chr(rng.choice([rng.randrange(0xD800), rng.randrange(0xE000, 0x110000)]))
                   for _ in range(rng.randint(1, 64)))


def random_number(rng: random.Random, f) -> int | float | bool:
    t = f.cpp_type
    if t == f.CPPTYPE_BOOL:
        return rng.random() < 0.5
    if t == f.CPPTYPE_DOUBLE:
        return rng.choice([0.0, -0.0, -1.0, 5e-324, 1e308, float("inf"), float("-inf"),
                           float("nan"), 0.5, 600.0, 600.5, rng.uniform(0, 100)])
    bits = 64 if t in (f.CPPTYPE_INT64, f.CPPTYPE_UINT64) else 32
    lo, hi = ((0, (1 << bits) - 1) if t in (f.CPPTYPE_UINT32, f.CPPTYPE_UINT64)
              else (-(1 << bits - 1), (1 << bits - 1) - 1))
    picks = [0, 1, 2, -1, lo, hi, hi - 1, 1 << 16, (1 << 16) + 1, 1 << 20, (1 << 20) + 1,
             rng.randint(-100, 1000), rng.randint(lo, hi)]
    return rng.choice([v for v in picks if lo <= v <= hi])


def random_proto(rng: random.Random, data: dict, pool: list[str]) -> tuple[str, bytes]:
    """A valid request whose fields, each with a chance, hold hostile values of their type."""
    req = valid_request(rng, data)
    if rng.random() < 0.1:
        req.pipeline_name = random_string(rng, pool)
        return f"pipeline_name={req.pipeline_name[:80]!r}", req.SerializeToString()
    chance, changed = rng.choice([0.1, 0.3, 1.0]), []
    for table in req.spec.DESCRIPTOR.fields:
        msg = getattr(req.spec, table.name)
        for f in msg.DESCRIPTOR.fields:
            if rng.random() >= chance:
                continue
            if f.is_repeated:
                values = [random_string(rng, pool) for _ in range(rng.choice([0, 1, 2, 300]))]
                del getattr(msg, f.name)[:]
                getattr(msg, f.name).extend(values)
                value = values[:2]
            else:
                value = (random_string(rng, pool) if f.cpp_type == f.CPPTYPE_STRING
                         else random_number(rng, f))
                setattr(msg, f.name, value)
            changed.append(f"{table.name}.{f.name}={value!r:.80}")
    if rng.random() < 0.1:
        req.protocol_version = rng.choice([0, 1, PROTOCOL_VERSION + 1, (1 << 32) - 1])
        changed.append(f"protocol_version={req.protocol_version}")
    if rng.random() < 0.1:
        req.resume_state = rng.randbytes(rng.randint(1, 64))
        changed.append("resume_state=random bytes")
    return ", ".join(changed) or "unchanged", req.SerializeToString()


def mutate_bytes(rng: random.Random, blob: bytes, other: bytes) -> tuple[str, bytes]:
    """Bit flips, cuts and splices: each op names itself in the summary."""
    b, ops = bytearray(blob), []
    for _ in range(rng.randint(1, 3)):
        op, at = rng.choice(["flip", "cut", "insert", "dup", "splice", "varint"]), \
            rng.randrange(len(b) + 1)
        if op == "flip" and b:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == "cut":
            del b[at:]
        elif op == "insert":
            b[at:at] = rng.randbytes(rng.randint(1, 32))
        elif op == "dup":  # a repeated field or sub-message twice: proto merges them
            b += b[at:]
        elif op == "splice":
            b[at:] = other[rng.randrange(len(other) + 1):]
        elif op == "varint":  # a length or tag that never ends
            b[at:at] = b"\xff" * rng.randint(1, 12)
        ops.append(f"{op}@{at}")
    return " ".join(ops), bytes(b)


def tamper_state(rng: random.Random, state: bytes) -> tuple[str, bytes]:
    """A real state made wrong in one of the ways a client or a disk could."""
    d, op = json.loads(state), rng.choice(["set", "delete", "literal", "deep", "non_utf8",
                                           "bytes", "duplicate", "huge"])
    key = rng.choice(sorted(d))
    if op == "set":
        d[rng.choice([key, "extra"])] = rng.choice(
            [1 << 70, 1 << 63, (1 << 63) - 1, -1, 1.5, "3", "", True, None, [], {"a": 1},
             float("inf"), float("nan"), rng.randint(0, 500), 10 ** 6, "1" * 1000])
        return f"set {key}", json.dumps(d).encode()
    if op == "delete":
        del d[key]
        return f"delete {key}", json.dumps(d).encode()
    if op == "literal":
        lit = rng.choice(["Infinity", "-Infinity", "NaN", "1e400", str(1 << 64), "-0", "1.0",
                          "true", "null", "[]", '"0"', "0x10", "01"])
        d[key] = "@@"
        return f"{key}={lit}", json.dumps(d).replace('"@@"', lit).encode()
    if op == "deep":
        n = rng.choice([100, 1000, 100_000])
        return f"deep {n}", rng.choice([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n])
    if op == "non_utf8":
        at = rng.randrange(len(state))
        return f"non-utf8@{at}", state[:at] + rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xe9"]) \
            + state[at:]
    if op == "bytes":
        return mutate_bytes(rng, state, state)
    if op == "duplicate":
        return f"duplicate {key}", state[:-1] + f',"{key}":{1 << 62}}}'.encode()
    return "huge", state[:-1] + b',"pad":"' + b"x" * 1_000_000 + b'"}'


def next_request(rng: random.Random, data: dict, pool: list[str], state: bytes,
                 state_source: dict) -> tuple[str, str, bytes]:
    """(kind, summary, payload) of one request, by the mix of kinds."""
    kind = rng.choices(["random_bytes", "mutated", "random_proto", "tampered_state"],
                       weights=[2, 3, 3, 2])[0]
    if kind == "random_bytes":
        n = rng.choice([0, 1, 8, 64, 512, 4096, 1 << 20])
        return kind, f"{n} random bytes", rng.randbytes(n)
    if kind == "mutated":
        req = valid_request(rng, data)
        req.resume_state = state if rng.random() < 0.3 else b""
        base, other = req.SerializeToString(), valid_request(rng, data).SerializeToString()
        return (kind, *mutate_bytes(rng, base, other))
    if kind == "random_proto":
        return (kind, *random_proto(rng, data, pool))
    summary, bad = tamper_state(rng, state)
    req = valid_request(random.Random(0), data, state_source)  # the state's own spec
    req.resume_state = bad
    return kind, summary, req.SerializeToString()


# --- calls and checks -----------------------------------------------------------------------------

def call(channel: grpc.Channel, payload: bytes, deadline_s: float, max_messages: int
         ) -> tuple[str, str, list[bytes]]:
    """(status name, message, raw messages read); cancels after `max_messages` (OK)."""
    stream = channel.unary_stream(METHOD)(payload, timeout=deadline_s)
    got: list[bytes] = []
    try:
        for raw in stream:
            got.append(raw)
            if len(got) >= max_messages:
                stream.cancel()
                break
        return "OK", "", got
    except grpc.RpcError as e:
        return e.code().name, e.details() or "", got


def judge(status: str, message: str, got: list[bytes], seconds: float, deadline_s: float
          ) -> str | None:
    """The finding an answer makes, if any."""
    if status == "INTERNAL":
        return "internal"
    if status not in CONTRACT:
        return "status outside the contract"
    if "Traceback" in message:
        return "traceback on the wire"
    if seconds > deadline_s + 5:
        return "hang"  # the deadline itself was not kept
    try:
        for raw in got:
            pb.Batch.FromString(raw)
    except Exception:  # noqa: BLE001 - any failure to parse is the finding
        return "unreadable batch"
    return None


class Watch(threading.Thread):
    """Samples the server's RSS (and its workers'); past the limit, kills it so runs stay
    bounded in memory (RLIMIT_AS would break Grain's workers)."""

    def __init__(self, pid: int, limit_mb: float, on_exceed):
        super().__init__(name="rss-watch", daemon=True)
        self.proc, self.limit_mb, self.on_exceed = psutil.Process(pid), limit_mb, on_exceed
        self.peak_mb, self.stop = 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                total = sum(p.memory_info().rss for p in [self.proc, *self.proc.children(True)])
            except psutil.Error:
                continue
            self.peak_mb = max(self.peak_mb, total / 2**20)
            if self.peak_mb > self.limit_mb:
                self.on_exceed(self.peak_mb)
                return


def rss_mb(pid: int) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:  # gone, or a zombie
        return None


def alive(pid: int | None) -> bool:
    try:
        return pid is None or psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leftovers(pid: int) -> list[int]:
    """The server's live worker processes (not multiprocessing's resource tracker)."""
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(
                    p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def safe_health(target: str) -> str:
    try:
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING"}.get(health(target), "?")
    except grpc.RpcError as e:
        return f"unreachable ({e.code().name})"


# --- the run --------------------------------------------------------------------------------------

def start_server(root: str) -> tuple[ChildProcess, str]:
    target = f"unix://{root}/fuzz.sock"
    helps = subprocess.run(cli_argv("serve", "--help"), capture_output=True, text=True).stdout
    roots = ["--data-root", root] if "--data-root" in helps else []
    child = ChildProcess(cli_argv("serve", "--listen", target, *roots),
                         log=os.path.join(root, "server.log"))
    deadline = time.monotonic() + 120
    while safe_health(target) != "SERVING":
        if child.p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start; see {root}/server.log")
        time.sleep(0.2)
    return child, target


def fuzz(args: argparse.Namespace, target: str, pid: int | None, data: dict,
         kill_server) -> dict:
    rng, pool = random.Random(args.seed), string_pool(data)
    channel = grpc.insecure_channel(target, options=MESSAGE_OPTIONS)
    findings: dict[tuple, dict] = {}

    def find(kind: str, request: str, status: str, message: str, payload: bytes = b"") -> None:
        f = findings.setdefault((kind, status, message[:60]), {
            "kind": kind, "request": request[:300], "status": status, "message": message[:200],
            "count": 0})
        f["count"] += 1
        # The shortest payload seen is the reproducer to keep.
        if payload and len(payload) <= 256 and len(payload) < len(f.get("payload_hex", "x" * 600)) / 2:
            f.update(request=request[:300], message=message[:200], payload_hex=payload.hex())

    # Warm-up: a stream of every format (their readers load once) gives the state to tamper.
    states = []
    for source in data["sources"]:
        status, message, got = call(channel, valid_request(random.Random(0), data, source)
                                    .SerializeToString(), 60, 3)
        if status != "OK" or not got:
            find("warm-up stream", str(source), status, message)
        states.append((source, pb.Batch.FromString(got[-1]).state if got else b"{}"))
    time.sleep(1)
    before = rss_mb(pid) if pid else None
    watch = None
    if pid:
        watch = Watch(pid, args.max_rss_mb, lambda mb: (find("rss limit", "", "", f"{mb:.0f} MB"),
                                                        kill_server()))
        watch.start()
    counts, by_kind = collections.Counter(), collections.defaultdict(collections.Counter)
    start, sent, trace = time.monotonic(), 0, []
    while sent < args.requests and time.monotonic() - start < args.max_seconds:
        source, state = rng.choice(states)
        kind, summary, payload = next_request(rng, data, pool, state, source)
        t0 = time.monotonic()
        status, message, got = call(channel, payload, args.deadline_s, rng.randint(1, 3))
        sent += 1
        counts[status] += 1
        by_kind[kind][status] += 1
        finding = judge(status, message, got, time.monotonic() - t0, args.deadline_s)
        if finding:
            find(finding, f"#{sent - 1} {kind}: {summary}", status, message, payload)
        if not alive(pid):
            find("server died", f"#{sent - 1} {kind}: {summary}", status, message, payload)
            break
        if pid and sent % 100 == 0:
            trace.append(round(rss_mb(pid) or 0))
        if sent % 25 == 0 and (h := safe_health(target)) != "SERVING":
            find("health", f"after request #{sent - 1}", h, "")
            break
    seconds = time.monotonic() - start
    if watch:
        watch.stop.set()
    # Settle: streams end and worker processes go within about a second of their client.
    deadline, after, left = time.monotonic() + args.settle_s, None, []
    while pid and alive(pid):
        after, left = rss_mb(pid), leftovers(pid)
        if (not left and after and after <= before * (1 + RSS_TOLERANCE)) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if left:
        find("worker processes left", "", "", f"pids {left}")
    status, message, got = call(channel, valid_request(rng, data).SerializeToString(), 60, 2)
    if status != "OK" or not got:
        find("final stream", "a valid request after the run", status, message)
    change = (after / before - 1) * 100 if before and after else None
    if change is not None and change > RSS_TOLERANCE * 100:
        find("rss growth", "", "", f"{before:.1f} MB -> {after:.1f} MB ({change:+.1f} %)")
    end_health = safe_health(target)
    if end_health != "SERVING":
        find("health", "at the end", end_health, "")
    channel.close()
    return {"seed": args.seed, "requests": sent, "statuses": dict(counts.most_common()),
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "findings": list(findings.values()),
            "rss_mb_before": before and round(before, 1), "rss_mb_after": after and round(after, 1),
            "rss_change_pct": change and round(change, 2),
            "rss_mb_peak": watch and round(watch.peak_mb, 1), "rss_mb_every_100": trace,
            "health": end_health,
            "seconds": round(seconds, 1), "server": target}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="stop sending after this long (the build and the checks add more)")
    parser.add_argument("--deadline-s", type=float, default=3.0, help="each call's deadline")
    parser.add_argument("--server", help="a running server's unix:// address (else one is started)")
    parser.add_argument("--server-pid", type=int, help="its pid, to measure its RSS")
    parser.add_argument("--data-dir", help="with --server: a folder inside its data roots")
    parser.add_argument("--max-rss-mb", type=float, default=3072.0,
                        help="kill the server past this much memory (with its workers)")
    parser.add_argument("--settle-s", type=float, default=10.0,
                        help="at most this long for streams and workers to go at the end")
    args = parser.parse_args(argv)
    if args.server and not args.server.startswith("unix"):
        parser.error("--server must be a Unix socket (unix:///path or unix:path)")
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        # A fresh folder each run, even inside a running server's data root.
        data = build_data(os.path.realpath(tempfile.mkdtemp(dir=args.data_dir or tmp)))
        child = None
        if args.server:
            target, pid = args.server, args.server_pid
        else:
            child, target = start_server(data["root"])
            pid = child.p.pid
        try:
            result = fuzz(args, target, pid, data, child.kill if child else lambda: None)
        finally:
            if child:
                child.p.terminate()  # SIGTERM: the server drains and exits 0
                code = child.p.wait(timeout=30)
                child.kill()
        if child and code != 0:
            result["findings"].append({"kind": "exit code", "request": "SIGTERM", "status": "",
                                       "message": f"exit code {code}", "count": 1})
    ok = (not result["findings"] and result["health"] == "SERVING"
          and (result["rss_change_pct"] is None or result["rss_change_pct"] <= 10))
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
