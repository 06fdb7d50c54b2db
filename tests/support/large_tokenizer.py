"""A large `tokenizer.json` against a real server in a memory cgroup, another client's stream
flowing: the scenario of the scaled-down test (tests/integration/test_large_tokenizer_memory.py)
and of the full-size one (tests/system/test_large_tokenizer_full.py)."""

from __future__ import annotations

import os
import time

from input_client import InputClient, PipelineSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.tokenizers.trainers import train_sentencepiece
from input_server.testing.memory_bound import bounded_server
from tests.support.flowing import assert_still_flowing, flowing_stream
from tests.support.processes import needs_memory_cgroup


def _settled(client: InputClient, deadline: float):
    """The newest stream's info once its backend is chosen (none loads behind it)."""
    while True:
        stream = max(client.info().streams, key=lambda s: s.stream_id)
        if not stream.tokenizer_backend_pending or time.monotonic() > deadline:
            return stream
        time.sleep(0.05)


def large_model_scenario(root: str, docs: list[str], make_model, *, cgroup_gb: float) -> dict:
    """A server in a `cgroup_gb` memory cgroup, another client's stream flowing; two streams
    of the tokenizer.json `make_model(folder)` writes there, with other BOS/EOS flags.
    Returns what was seen: the streams' backends and whys, peak memory (before, after each),
    the file's size; asserts the server lived and the other stream flowed."""
    needs_memory_cgroup("a large tokenizer needs one")
    model = os.path.join(root, "large")
    make_model(model)
    size = os.path.getsize(os.path.join(model, "tokenizer.json"))
    corpus = write_jsonl(docs[:200], os.path.join(root, "docs.jsonl"))
    good = PipelineSpec(
        source={"paths": [corpus]},
        tokenizer={"model": train_sentencepiece(docs[:300], os.path.join(root, "good"))},
        batch={"seq_len": 128, "size": 4},
        order={"epochs": 0},
        workers={"count": 0},
    )
    log = os.path.join(root, "server.log")
    seen: dict = {"size": size}
    with (
        bounded_server(root, gb=cgroup_gb, log=log) as server,
        flowing_stream(server.target, good.to_proto(), timeout=600, started=5) as flowing,
    ):
        seen["peak_before"] = server.peak.bytes
        for name, flags in (("first", (True, False)), ("second", (False, True))):
            spec = PipelineSpec(
                source={"paths": [corpus]},
                tokenizer={
                    "model": model,
                    "kind": "huggingface",
                    "add_bos": flags[0],
                    "add_eos": flags[1],
                },
                batch={"seq_len": 128, "size": 4},
                order={"epochs": 0},
                workers={"count": 0},
            )
            with InputClient(server.target) as c, c.batches(spec) as it:
                got = [next(it) for _ in range(3)]
                stream = _settled(c, time.monotonic() + 120)
                got += [next(it) for _ in range(3)]
            assert len(got) == 6
            seen[name] = (stream.tokenizer_backend, stream.tokenizer_backend_why)
            seen[f"peak_{name}"] = server.peak.bytes
            assert server.process.poll() is None, f"the server died on the {name} stream"
        assert_still_flowing(flowing)
    return seen
