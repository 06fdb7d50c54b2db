"""The measured hostile models at full size against a server in a 3 GB memory cgroup, with
another client's stream flowing: each is refused by name and the server lives on.

Measured before the bounds (issue 27, A4): a tokenizer.json replacing each space with 100,000
characters OOM-killed such a server in 7.7 s, a sentencepiece charsmap mapping one character
to 20,000 in 20 s, a 10 M-line tiktoken file on one DescribeTokenizer. Only inside a cgroup
(a failure must kill the server, not the host); skipped where none can be made.
"""

from __future__ import annotations

import base64
import json
import os
import time

import grpc
import pytest

from input_client import InputClient, PipelineSpec, StreamError
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.tokenizers.trainers import train_hf_tokenizer
from tests.support import bounded_server, flowing_stream, needs_memory_cgroup, other_stream_spec


def _models(root: str, docs: list[str]) -> dict[str, tuple[str, str, str]]:
    """(model, kind, corpus) of each hostile model, full size, with documents that meet it."""
    import sentencepiece as spm

    hf = train_hf_tokenizer(docs[:300], os.path.join(root, "hf"), vocab_size=400)
    model = json.load(open(os.path.join(hf, "tokenizer.json")))
    model["normalizer"] = {
        "type": "Replace",
        "pattern": {"String": " "},
        "content": "x" * 100_000,
    }
    json.dump(model, open(os.path.join(hf, "tokenizer.json"), "w"))
    spaces = write_jsonl(["a " * 5000] * 64, os.path.join(root, "spaces.jsonl"))
    # "§" -> 20,000 characters in the charsmap (the measured model mapped "e"; a character the
    # training text lacks keeps training fast).
    rule = os.path.join(root, "rule.tsv")
    open(rule, "w").write("A7\t" + " ".join(["4E"] * 20_000) + "\n")
    lines = [line for doc in docs[:200] for line in doc.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=os.path.join(root, "charsmap"),
        normalization_rule_tsv=rule,
        vocab_size=200,
        minloglevel=2,
        hard_vocab_limit=False,
        num_threads=1,
    )
    marks = write_jsonl(["§ " * 5000] * 64, os.path.join(root, "marks.jsonl"))
    ranks = os.path.join(root, "many.tiktoken")
    with open(ranks, "w", encoding="ascii") as f:  # 3 M lines, 45 MB
        for r in range(3_000_000):
            f.write(f"{base64.b64encode(r.to_bytes(3, 'big')).decode()} {r}\n")
    return {
        "normalizer": (hf, "huggingface", spaces),
        "charsmap": (os.path.join(root, "charsmap.model"), "sentencepiece", marks),
        "ranks": (ranks, "tiktoken", spaces),
    }


# 20 s when the bounds hold; without them the server thrashes in its cgroup until killed.
@pytest.mark.timeout(150)
def test_full_size_hostile_models_are_refused_while_another_stream_flows(tmp_path, docs):
    needs_memory_cgroup("full-size hostile models need one")
    root = str(tmp_path)
    hostile = _models(root, docs)
    good = other_stream_spec(docs, tmp_path)
    with (
        bounded_server(root, gb=3, log=os.path.join(root, "server.log")) as server,
        flowing_stream(server.target, good.to_proto(), timeout=600, started=5) as flowing,
    ):
        for name, (model, kind, corpus) in hostile.items():
            spec = PipelineSpec(
                source={"paths": [corpus]},
                tokenizer={"model": model, "kind": kind},
                batch={"seq_len": 128, "size": 4},
                workers={"count": 0},
            )
            with InputClient(server.target) as c, pytest.raises(StreamError) as e:
                with c.batches(spec) as it:
                    for _ in range(20):
                        next(it)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, (name, e.value)
            assert model in e.value.details, (name, e.value)
            assert server.process.poll() is None, f"the server died on {name}"
        before = len(flowing)
        time.sleep(1.0)
        assert len(flowing) > before, "the other stream stopped"
        # Refused before the work: the most held is the ranks read up to MAX_RANKS
        # (measured while writing this: 377 MB at the peak, the whole server included).
        assert server.peak.bytes < 1.5 * (1 << 30), f"peak RSS {server.peak.bytes >> 20} MB"
