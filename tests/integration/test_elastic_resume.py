"""Elastic resume on a real server: hosts stream part of an epoch of real text, save their
states, and another number of hosts resume from `reshard(states, count)`. Every document
starts with a marker the model keeps as one token (`<dN>`), so the batches say which
documents they hold: each is read once."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter

import grpc
import numpy as np
import pytest
import sentencepiece as spm

from input_client import InputClient, PipelineSpec, StreamError, reshard
from input_server.batching.pipeline import Pipeline
from input_server.testing.reference import run_pipeline
from tests.support import TOKENS
from tests.support.elastic import Ledger, components_at

DOCS = 240


@pytest.fixture(scope="module")
def marked(docs, tmp_path_factory) -> dict:
    """Two files of real documents, each opening with its marker, and a model trained on
    them that keeps every marker one piece."""
    d = tmp_path_factory.mktemp("elastic")
    texts = [f"<d{n}> {doc}" for n, doc in enumerate(docs[:DOCS])]
    paths = []
    for name, part in (("a", texts[: DOCS // 2]), ("b", texts[DOCS // 2 :])):
        paths.append(os.path.join(d, f"{name}.jsonl"))
        with open(paths[-1], "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in part)
    lines = (line for doc in docs for line in doc.splitlines() if line.strip())
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines,
        model_prefix=os.path.join(d, "m"),
        vocab_size=1000 + DOCS,
        user_defined_symbols=[f"<d{n}>" for n in range(DOCS)],
        pad_id=0, bos_id=1, eos_id=2, unk_id=3,
        hard_vocab_limit=False, num_threads=2, minloglevel=2,
    )  # fmt: skip
    model = os.path.join(d, "m.model")
    ids = spm.SentencePieceProcessor(model_file=model)
    return {
        "paths": paths,
        "model": model,
        "marker": [ids.piece_to_id(f"<d{n}>") for n in range(DOCS)],
    }


def _spec(marked, *, mixture: bool, shard, epochs: int) -> PipelineSpec:
    a, b = marked["paths"]
    source = (
        [{"paths": [a], "name": "a", "weight": 1}, {"paths": [b], "name": "b", "weight": 2}]
        if mixture
        else {"paths": [a, b]}
    )
    packing, policy = ("first_fit", "chunk") if mixture else ("concat_then_split", "split")
    return PipelineSpec(
        source=source,
        tokenizer={"model": marked["model"]},
        batch={"seq_len": 64, "size": 2, "packing": packing, "long_documents": policy},
        order={"seed": 11, "epochs": epochs},
        shard={"index": shard[0], "count": shard[1]},
        workers={"count": 0},
    )


def _tokens(batch) -> list[int]:
    inputs, segments = np.asarray(batch["inputs"]), np.asarray(batch["inputs_segmentation"])
    return inputs[segments > 0].tolist()


def _stream(target, spec, state, take=None, until=None):
    """Batches of `spec` from `state` on the server (all, `take` of them, or until `until`
    says stop before a batch): their tokens, and the state after the last."""
    tokens = []
    with InputClient(target, token=TOKENS.get(target)) as client:
        with client.batches(spec, state=state) as it:
            while take is None or take > 0:
                if until is not None and until(state):
                    break
                batch = next(it, None)
                if batch is None:
                    break
                tokens += _tokens(batch)
                state = json.loads(json.dumps(it.get_state()))
                take = None if take is None else take - 1
    return tokens, state


@pytest.mark.parametrize("chain", [(4, 3), (3, 5), (4, 3, 5)])
def test_one_source_resumes_on_any_host_count_every_document_once(server, marked, chain, caplog):
    """concat_then_split: partly used documents continue from their token. Each count but the
    last streams part of the epoch; the last runs to its end. Its log says it is resharded."""
    caplog.set_level(logging.INFO, logger="input_server")
    target = server.targets[0]
    pass_ = run_pipeline(_spec(marked, mixture=False, shard=(0, 1), epochs=1))
    want = Counter(t for p in pass_ for t in _tokens(p.arrays))
    got, states = Counter(), [None] * chain[0]
    takes = [3, 5, 2, 6, 4]
    for step, count in enumerate(chain):
        if step:
            states = reshard(states, count)
        last = step == len(chain) - 1
        for i in range(count):
            spec = _spec(marked, mixture=False, shard=(i, count), epochs=1)
            tokens, states[i] = _stream(target, spec, states[i], None if last else takes[i])
            got.update(tokens)
    said = f"resharded: share 0 of {chain[1]} of what {chain[0]} old streams left"
    assert any(said in r.getMessage() for r in caplog.records), said
    markers = Counter({m: got[m] for m in marked["marker"]})
    assert set(markers.values()) == {1}, "documents read twice or skipped"
    assert got == want  # every token of the epoch, once


@pytest.mark.parametrize("chain", [(4, 3), (3, 5)])
def test_a_mixture_resumes_on_another_host_count_every_document_once(server, marked, chain):
    """first_fit with chunked long documents, forever: the new hosts read until they have read
    what they were dealt; each document is read as often as the rule says (its begun epochs,
    plus what the new shards read of the next), counted without the server's elastic code."""
    target = server.targets[0]
    c, new_count = chain
    half = DOCS // 2
    ledger = Ledger([half, half], c)
    got = Counter()
    states = []
    for i, take in zip(range(c), [4, 9, 2, 7], strict=False):
        spec = _spec(marked, mixture=True, shard=(i, c), epochs=0)
        tokens, state = _stream(target, spec, None, take)
        got.update(tokens)
        states.append(state)
        ledger.old(*_components_at(spec, state))
    for j, state in enumerate(reshard(states, new_count)):
        spec = _spec(marked, mixture=True, shard=(j, new_count), epochs=0)
        # Until its state is a plain one of its shard: it says it has read all it was
        # dealt (the ledger checks that it had).
        tokens, state = _stream(target, spec, state, until=lambda s: "elastic" not in s)
        got.update(tokens)
        fresh = Pipeline(spec).order
        ledger.new(fresh, j, new_count, *_components_at(spec, state), plain=True)
    want = Counter()
    for (k, r), times in ledger.whole().items():
        want[marked["marker"][k * half + r]] = times
    for k, r, _ in ledger.partial:  # a chunk was read: its first, with the marker
        want[marked["marker"][k * half + r]] += 1
    assert {m: got[m] for m in want} == dict(want)


_PIPELINES: dict[str, Pipeline] = {}


def _components_at(spec, state):
    """Where a stream of `spec` stands after `state`, read by the server's own parser."""
    pipeline = _PIPELINES.get(spec.to_toml())
    if pipeline is None:
        pipeline = _PIPELINES[spec.to_toml()] = Pipeline(spec)
    pos = pipeline.parse_state(json.dumps(state).encode() if state else None)
    return components_at(pipeline.order_at(pos), pos)


def _resharded(marked, target, count=3):
    states = []
    for i in range(2):
        spec = _spec(marked, mixture=False, shard=(i, 2), epochs=1)
        states.append(_stream(target, spec, None, take=2)[1])
    return reshard(states, count)


def _forged(new: dict, **changes) -> dict:
    out = json.loads(json.dumps(new))
    elastic = out["elastic"]
    for key, value in changes.items():
        if key == "entry":
            elastic["from"][0].update(value)
        else:
            elastic[key] = value
    return out


def test_a_resharded_state_that_does_not_fit_is_refused_by_name(server, marked):
    target = server.targets[0]
    new = _resharded(marked, target)
    spec = _spec(marked, mixture=False, shard=(0, 3), epochs=1)
    other_seed = _spec(marked, mixture=False, shard=(0, 2), epochs=1).replace(order={"seed": 12})
    cases = {
        "resharded for shard [1, 3]": new[1],
        "'deal' [5, 3] is not [k, n]": _forged(new[0], deal=[5, 3]),
        "old stream 0 names shard ['x']": _forged(new[0], entry={"shard": ["x"]}),
        "made for other data": _forged(
            new[0], entry={"fingerprint": other_seed.data_fingerprint()}
        ),
        "is past the stream's 120 documents": _forged(new[0], entry={"doc": 240_000}),
        "not the 2 shards of one count": _forged(
            new[0], **{"from": [new[0]["elastic"]["from"][0]] * 2}
        ),
        "names shard [1, 1000000000000]": _forged(new[0], entry={"shard": [1, 10**12]}),
        "over 4096 old streams": _forged(
            new[0], **{"from": [{"shard": [i, 4097]} for i in range(4097)]}
        ),
    }
    with InputClient(target, token=TOKENS.get(target)) as client:
        for needle, state in cases.items():
            with client.batches(spec, state=state) as it, pytest.raises(StreamError) as e:
                next(it)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, (needle, e.value)
            assert any(n in e.value.details for n in needle.split("|")), (needle, e.value)
