"""input_client.maxtext's source against a real server (no MaxText here;
tests/system/test_maxtext.py runs it in MaxText's own loop): the tokenizer's description, resume
through get_state/set_state as MaxText's checkpoint stores it, eval passes that repeat,
per-host shards."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest

from input_client import StreamError
from input_client.maxtext.conventions import to_maxtext
from input_client.maxtext.source import ServerSource
from tests.support import run_pipeline


def _source(client, spec, pad_id=-1):
    return ServerSource(
        lambda state: client.batches(spec, state=state), pad_id=pad_id, packing=spec.batch.packing
    )


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        sorted(x) == sorted(y) and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def test_the_server_describes_the_specs_model(client, make_spec, spm_model):
    import sentencepiece as spm

    info = client.describe_tokenizer(make_spec())
    sp = spm.SentencePieceProcessor(model_file=spm_model)
    assert (info.vocab_size, info.pad_id, info.bos_id, info.eos_id, info.unk_id) == (
        sp.vocab_size(),
        sp.pad_id(),
        sp.bos_id(),
        sp.eos_id(),
        sp.unk_id(),
    )
    assert info.sha256 == hashlib.sha256(open(spm_model, "rb").read()).hexdigest()


def test_a_model_outside_the_roots_is_refused_by_name(client, make_spec):
    spec = make_spec(tokenizer={"model": "/etc/passwd"})
    with pytest.raises(StreamError) as e:
        client.describe_tokenizer(spec)
    assert e.value.code.name == "PERMISSION_DENIED" and "/etc/passwd" in e.value.details


def test_batches_are_the_pipelines_in_maxtexts_form(client, make_spec):
    spec = make_spec()
    got = list(_source(client, spec))
    want = [to_maxtext(p.arrays, -1, "first_fit") for p in run_pipeline(spec)]
    assert _same(got, want)


def test_a_checkpointed_position_resumes_exactly(client, make_spec):
    spec = make_spec(order={"epochs": 0})
    source = _source(client, spec)
    first = iter(source)
    for _ in range(7):
        next(first)
    blob = first.get_state()  # what MaxText writes to iter/process_0-of-1.json
    assert isinstance(blob, bytes) and blob.decode().startswith("{")
    rest = [next(first) for _ in range(5)]
    first.close()
    # A restarted trainer: a new source, iter() at construction, set_state before next().
    again = iter(_source(client, spec))
    again.set_state(blob.decode().encode())
    assert _same([next(again) for _ in range(5)], rest)
    again.close()


def test_a_state_set_mid_stream_moves_the_stream_there(client, make_spec):
    spec = make_spec(order={"epochs": 0})
    reference = iter(_source(client, spec))
    batches = [next(reference) for _ in range(9)]
    state_after_3 = None
    it = iter(_source(client, spec))
    for i in range(6):
        next(it)
        if i == 2:
            state_after_3 = it.get_state()
    it.set_state(state_after_3)  # back to batch 4, with the stream already open
    assert _same([next(it) for _ in range(6)], batches[3:9])
    it.close()
    reference.close()


def test_state_before_any_batch_restores_to_the_start(client, make_spec):
    spec = make_spec()
    fresh = iter(_source(client, spec))
    blob = fresh.get_state()
    it = iter(_source(client, spec))
    it.set_state(blob)
    assert _same([next(it) for _ in range(3)], [next(fresh) for _ in range(3)])
    it.close()
    fresh.close()


def test_each_eval_pass_is_the_same_finite_pass(client, make_spec):
    spec = make_spec(order={"shuffle": False, "epochs": 1})
    source = _source(client, spec)
    one = list(iter(source))
    two = list(iter(source))  # MaxText's reset() before the next eval
    assert one and _same(one, two)


def _documents(source) -> Counter:
    return Counter(
        tuple(row[seg == i])
        for b in source
        for row, seg in zip(b["inputs"], b["inputs_segmentation"], strict=True)
        for i in range(1, int(seg.max()) + 1)
    )


def test_two_hosts_shards_split_the_documents(client, make_spec):
    spec = make_spec(order={"shuffle": False, "epochs": 1})
    parts = [
        _documents(_source(client, spec.replace(shard={"index": i, "count": 2}))) for i in (0, 1)
    ]
    assert parts[0] and parts[1] and parts[0] != parts[1]
    assert parts[0] + parts[1] == _documents(_source(client, spec))  # each once, none lost
