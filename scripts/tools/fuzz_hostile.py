"""The fuzz run's attacks of issue 27 on the server: one file named many times, Parquet bombs and
hostile model files (the HTTP/2 flood is `fuzz_flood.py`, a malicious server against the client
`fuzz_client.py`). Each is seeded by the run's --seed and bounded in count and size, and checks what
`fuzz_attacks.py`'s do: health and `GetInfo` answer within ANSWER_S while it runs, and the attacker
gets its status by name. The builders are the tests' own (`input_server.testing.attacks`), at the
smaller sizes the tests show refused by structure (a normalizer's description, the ranks cap, the
row group's reservation), so a fuzz server outside any memory cgroup is not hurt if a bound
regressed: the finding is then the status, not the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Iterator

import grpc
import psutil
from fuzz_attacks import Finding, raw_stream, server_answers

from input_client.proto import pb
from input_server.testing import attacks

DESCRIBE = "/input_server.v1.InputService/DescribeTokenizer"
# The repeated-paths attack's file, as measured (20,000 documents, 600 KB). With the fuzz server's
# --stream-memory-mb 256, 4,096 components of it (82 M documents, 4 bytes each a permutation)
# are refused before any order is built, 2,048 may be admitted (OK is an answer too), and a few
# stream (with no workers: a worker process takes seconds to start).
REPEATED_DOCS = 20_000
FEW, MANY = (2, 16), (2048, 4096)
# What a hostile normalizer or charsmap makes of one character: the tests' size, refused by the
# normalizer's description (the measured 100,000 would be refused the same way; if the bound
# regressed, this one costs a few MB, not the fuzz server).
EXPANSION = 2000
# RSS the server may keep after an attack (the idle server trims its heap a second after its
# last stream; a few cached readers and models remain).
KEPT_MB = 96


def _status(call) -> tuple[str, str]:
    try:
        call()
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def _first(channel: grpc.Channel, req: pb.StreamBatchesRequest, deadline_s: float):
    """(status, details) of a stream's first message."""
    call = raw_stream(channel)
    return _status(lambda: next(iter(call(iter([req.SerializeToString()]), timeout=deadline_s))))


def _rss_mb(pid: int | None) -> float | None:
    if not pid:
        return None
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20
    return None


@contextlib.contextmanager
def watching(channel: grpc.Channel, target: str, label: str, pid: int | None) -> Iterator[list]:
    """Health and info asked every half second while the block runs, and RSS back within
    KEPT_MB of where it was within 5 s of the end: the findings go to the yielded list."""
    found: list[Finding] = []
    done, before = threading.Event(), _rss_mb(pid)

    def watch() -> None:
        while not done.wait(0.5):
            found.extend(server_answers(channel, target, f"during {label}"))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield found
    finally:
        done.set()
        watcher.join()
    found.extend(server_answers(channel, target, f"after {label}"))
    if before is not None:
        deadline, after = time.monotonic() + 5, _rss_mb(pid)
        while after is not None and after > before + KEPT_MB and time.monotonic() < deadline:
            time.sleep(0.25)
            after = _rss_mb(pid)
        if after is None or after > before + KEPT_MB:
            found.append(("memory kept", label, "", f"{before:.0f} MB -> {after or 0:.0f} MB"))


def _request(
    template: pb.StreamBatchesRequest, sources: list[pb.Source], **spec
) -> pb.StreamBatchesRequest:
    req = pb.StreamBatchesRequest()
    req.CopyFrom(template)
    del req.spec.mixture[:]
    req.spec.ClearField("source")
    if len(sources) == 1:
        req.spec.source.CopyFrom(sources[0])
    else:
        req.spec.mixture.extend(sources)
    for name, value in spec.items():
        getattr(req.spec, name).CopyFrom(value)
    return req


# --- one file named many times ---------------------------------------------------------------


def _repeated_file(root: str) -> tuple[str, list[str]]:
    """A file of REPEATED_DOCS documents and the names of it: plain, `./` and `..` forms, a
    glob that matches it alone, a link to it."""
    folder = os.path.join(root, "repeated")
    path = os.path.join(folder, "big.jsonl")
    if not os.path.exists(path):
        os.makedirs(folder)
        with open(path, "w") as f:
            for i in range(REPEATED_DOCS):
                f.write(json.dumps({"text": f"document {i} of many, all work and no play"}) + "\n")
        os.symlink(path, os.path.join(folder, "link.data"))
    names = [
        path,
        os.path.join(folder, ".", "big.jsonl"),
        os.path.join(root, ".", "repeated", "big.jsonl"),
        os.path.join(folder, "..", "repeated", "big.jsonl"),
        os.path.join(folder, "b*.jsonl"),
        os.path.join(folder, "link.data"),
    ]
    return path, names


def repeated_paths(channel, target, template, root, deadline_s, rng, pid) -> list[Finding]:
    """One file named 2 to 3,000 times in any mix of its names: INVALID_ARGUMENT naming
    `source.paths` (issue 27: 40,000 copies were 800 M documents, the server OOM-killed); up
    to 4,096 mixture components of it with 0-2 workers: OK, or RESOURCE_EXHAUSTED naming
    --stream-memory-mb before any order is built."""
    path, names = _repeated_file(root)
    found: list[Finding] = []
    with watching(channel, target, "repeated paths", pid) as seen:
        for n in (2, rng.randint(3, 100), rng.randint(100, 3000)):
            paths = [names[0], rng.choice(names[1:])] + [rng.choice(names) for _ in range(n - 2)]
            rng.shuffle(paths)
            label = f"one file named {n} times ({len(set(paths))} distinct names)"
            source = pb.Source(paths=paths, format="jsonl")
            status, message = _first(channel, _request(template, [source]), deadline_s)
            if status != "INVALID_ARGUMENT" or "`source.paths`" not in message:
                found.append(("repeated path accepted", label, status, message[:300]))
        for k, workers in [(rng.choice(FEW), 0), (rng.choice(MANY), rng.randint(0, 2))]:
            epochs = rng.choice([0, 1, 2])
            label = f"{k} components of one file, {workers} workers, epochs {epochs}"
            req = _request(
                template,
                [pb.Source(paths=[path], format="jsonl")] * k,
                workers=pb.Workers(count=str(workers)),
                order=pb.Order(seed=rng.randrange(100), shuffle=True, epochs=epochs),
            )
            status, message = _first(channel, req, max(deadline_s, 30))
            refused = status == "RESOURCE_EXHAUSTED" and "--stream-memory-mb" in message
            if status != "OK" and not refused:
                found.append(("repeated components", label, status, message[:300]))
    return found + seen


# --- Parquet bombs ---------------------------------------------------------------------------


def parquet_bombs(channel, target, template, root, deadline_s, bomb_mb, pid) -> list[Finding]:
    """A text bomb (one dictionary entry of 1 MiB, `bomb_mb` rows) and an ids bomb (one row
    group the footer names until it is `bomb_mb` MiB of ids), each a few KB: RESOURCE_EXHAUSTED
    naming the row group and --max-decompressed-mb (issue 27: 5.8 KB of 3.6 GB of text
    OOM-killed the server in ~10 s)."""
    folder = os.path.join(root, "pbombs")
    os.makedirs(folder, exist_ok=True)
    text = os.path.join(folder, "text.parquet")
    ids = os.path.join(folder, "ids.parquet")
    if not os.path.exists(text):
        attacks.text_bomb(text, rows=bomb_mb)
        attacks.ids_bomb(ids, row_groups=max(2, bomb_mb * 1000 // 3815))  # 3.8 MiB a group
    found: list[Finding] = []
    for source in (
        pb.Source(paths=[text], format="parquet"),
        pb.Source(paths=[ids], format="parquet", token_field="ids"),
    ):
        label = f"a {os.path.getsize(source.paths[0]) >> 10} KB Parquet bomb of {bomb_mb} MB"
        label += " of ids" if source.token_field else " of text"
        with watching(channel, target, label, pid) as seen:
            status, message = _first(channel, _request(template, [source]), max(deadline_s, 30))
        named = "row group" in message and "--max-decompressed-mb" in message
        if status != "RESOURCE_EXHAUSTED" or not named or ".parquet" not in message:
            found.append(("parquet bomb", label, status, message[:300]))
        found += seen
    return found


# --- hostile model files ---------------------------------------------------------------------


def _hostile_models(data: dict) -> list[tuple[str, str, str]]:
    """(label, model, kind) of each hostile model, and the corpus that meets it."""
    root, folder = data["root"], os.path.join(data["root"], "hostile-models")
    made = os.path.join(folder, ".made")
    hf = next(m for k, m in data["models"] if k == "huggingface")
    spm = next(m for k, m in data["models"] if k == "sentencepiece")
    tiktoken = next(m for k, m in data["models"] if k == "tiktoken")
    out = [
        ("replace", os.path.join(folder, "replace"), "huggingface"),
        ("chain", os.path.join(folder, "chain"), "huggingface"),
        ("regex", os.path.join(folder, "regex"), "huggingface"),
        ("charsmap", os.path.join(folder, "charsmap.model"), "sentencepiece"),
        ("ranks", os.path.join(folder, "many.tiktoken"), "tiktoken"),
        ("line", os.path.join(folder, "line.tiktoken"), "tiktoken"),
    ]
    given = {"spm": spm, "tiktoken": tiktoken, "tokenizer.json": os.path.join(hf, "tokenizer.json")}
    for name, kind in [
        ("tiktoken", "sentencepiece"),
        ("tokenizer.json", "sentencepiece"),
        ("spm", "tiktoken"),
        ("tokenizer.json", "tiktoken"),
        ("spm", "huggingface"),
        ("tiktoken", "huggingface"),
    ]:
        out.append((f"{name} as {kind}", given[name], kind))
    if not os.path.exists(made):
        os.makedirs(folder, exist_ok=True)
        attacks.hf_variant(hf, out[0][1], normalizer=attacks.replace_normalizer(EXPANSION))
        attacks.hf_variant(hf, out[1][1], normalizer=attacks.doubling_chain(12))
        attacks.hf_variant(hf, out[2][1], pre_tokenizer=attacks.CATASTROPHIC_SPLIT)
        lines = [line for doc in data["docs"][:200] for line in doc.splitlines() if line.strip()]
        attacks.charsmap_model(lines, os.path.join(folder, "charsmap"), EXPANSION)
        attacks.tiktoken_ranks(out[4][1], (1 << 20) + 1)  # 13 MB, one past the cap
        attacks.tiktoken_long_line(out[5][1])
        with open(os.path.join(root, "meets.jsonl"), "w") as f:
            for text in ["see \u00a7 the free tree \u00a7", attacks.CATASTROPHIC_TEXT] * 8:
                f.write(json.dumps({"text": text}) + "\n")
        open(made, "w").close()
    return out


def hostile_models(channel, target, template, data, deadline_s, rng, pid) -> list[Finding]:
    """Each hostile model, and each good model under each wrong kind, described and streamed:
    INVALID_ARGUMENT naming the model, never INTERNAL or UNKNOWN (issue 27: a 100,000-character
    Replace OOM-killed the server in 7.7 s; a catastrophic regex answered INTERNAL)."""
    models = _hostile_models(data)
    rng.shuffle(models)
    corpus = pb.Source(paths=[os.path.join(data["root"], "meets.jsonl")], format="jsonl")
    describe = channel.unary_unary(DESCRIBE)
    found: list[Finding] = []
    with watching(channel, target, "hostile models", pid) as seen:
        for label, model, kind in models:
            tokenizer = pb.Tokenizer(model=model, kind=kind)
            req = _request(template, [corpus], tokenizer=tokenizer)
            blob = tokenizer.SerializeToString()
            for how, status, message in [
                ("DescribeTokenizer", *_status(lambda b=blob: describe(b, timeout=30))),
                ("a stream", *_first(channel, req, 30)),
            ]:
                if how == "DescribeTokenizer" and label == "regex" and status == "OK":
                    continue  # its regex fails on text alone: describing it reads none
                if status != "INVALID_ARGUMENT" or model not in message:
                    found.append((f"hostile model ({how})", label, status, message[:300]))
    return found + seen


def run_hostile(channel, target, template, data, deadline_s, add, *, seed, bomb_mb, pid) -> dict:
    """Every attack of this module in turn, seeded by `seed`; each finding goes to `add`.
    Returns the seconds each took."""
    rng, took, root = random.Random(seed), {}, data["root"]
    for name, attack in [
        (
            "repeated_paths",
            lambda: repeated_paths(channel, target, template, root, deadline_s, rng, pid),
        ),
        (
            "parquet_bombs",
            lambda: parquet_bombs(channel, target, template, root, deadline_s, bomb_mb, pid),
        ),
        (
            "hostile_models",
            lambda: hostile_models(channel, target, template, data, deadline_s, rng, pid),
        ),
    ]:
        start = time.monotonic()
        for finding in attack():
            add(*finding)
        took[name] = round(time.monotonic() - start, 1)
    return took
