"""Mixtures end to end: real files, real Grain, a real server. The documents are pre-tokenized
ids that say which component and which of its documents they are, so every batch can be read
back as the documents it holds."""

from __future__ import annotations

import json
import os

import grpc
import numpy as np
import pytest

from input_client import PipelineSpec, StreamError
from input_client.proto import pb
from tests.support import assert_same_batches, run_pipeline

SIZES = (300, 200, 500)
VOCAB = 10_000


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> list[str]:
    """Component c's document j: ids [c + 1, j + 1, then 5 + (j % 40) fillers]."""
    d = tmp_path_factory.mktemp("mix")
    paths = []
    for c, n in enumerate(SIZES):
        path = os.path.join(d, f"part{c}.jsonl")
        with open(path, "w") as f:
            for j in range(n):
                ids = [c + 1, j + 1] + [9] * (5 + j % 40)
                f.write(json.dumps({"ids": ids, "text": "unused"}) + "\n")
        paths.append(path)
    return paths


def _spec(parts, weights, *, names=True, epochs=0, shuffle=True) -> PipelineSpec:
    return PipelineSpec(
        source=[
            {
                "paths": [p],
                "token_field": "ids",
                "weight": w,
                **({"name": f"p{c}"} if names else {}),
            }
            for c, (p, w) in enumerate(zip(parts, weights, strict=True))
        ],
        tokenizer={"vocab_size": VOCAB, "add_bos": False, "add_eos": False},
        batch={"seq_len": 64, "size": 8, "packing": "none"},
        order={"epochs": epochs, "shuffle": shuffle, "seed": 11},
        workers={"count": 0},
    )


def _docs(batches) -> list[tuple[int, int]]:
    """(component, document) of every row, in order (packing "none": a row is a document)."""
    out = []
    for b in batches:
        inputs = b.batch.inputs if hasattr(b, "batch") else b["inputs"]
        out.extend((int(r[0]) - 1, int(r[1]) - 1) for r in inputs if r[0])
    return out


def test_shares_hold_in_every_window_of_1000_documents(parts):
    weights = (0.5, 0.3, 0.2)
    docs = _docs(run_pipeline(_spec(parts, weights), limit=600))
    comp = np.array([c for c, _ in docs])
    assert len(comp) == 4800
    for c, w in enumerate(weights):
        counts = np.concatenate([[0], np.cumsum(comp == c)])
        window = counts[1000:] - counts[:-1000]
        assert np.abs(window - 1000 * w).max() <= 10, c


def test_each_component_repeats_and_reshuffles_on_its_own(parts):
    docs = _docs(run_pipeline(_spec(parts, (1, 1, 1)), limit=300))
    for c, n in enumerate(SIZES[:2]):
        mine = [j for k, j in docs if k == c]
        first, second = mine[:n], mine[n : 2 * n]
        assert sorted(first) == sorted(second) == list(range(n))
        assert first != second


def test_a_finite_mixture_ends_where_its_first_component_runs_out(parts):
    docs = _docs(run_pipeline(_spec(parts, (0.2, 0.6, 0.2), epochs=1)))
    counts = [sum(1 for c, _ in docs if c == k) for k in range(3)]
    # Component 1 (200 documents at 60 %) runs out first; the others stop beside it.
    assert counts[1] == SIZES[1]
    assert counts[0] < SIZES[0] and counts[2] < SIZES[2]
    assert len({d for d in docs}) == len(docs)  # nothing twice


@pytest.mark.parametrize("workers", [(0, 3), (2, 1)], ids=["3-threads", "2-processes"])
def test_batches_do_not_depend_on_the_worker_count(parts, workers):
    spec = _spec(parts, (0.5, 0.3, 0.2))
    want = run_pipeline(spec, threads=1, limit=80)
    got = run_pipeline(spec, processes=workers[0], threads=workers[1], limit=80)
    assert_same_batches([g.batch.arrays() for g in got], [w.batch.arrays() for w in want])


def test_a_resume_state_continues_exactly(parts):
    spec = _spec(parts, (0.5, 0.3, 0.2), epochs=1).replace(batch={"packing": "first_fit"})
    whole = run_pipeline(spec)
    for k in (0, 7, len(whole) // 2, len(whole) - 2):
        rest = run_pipeline(spec, json.dumps(whole[k].state).encode())
        assert [r.seq for r in rest] == [w.seq for w in whole[k + 1 :]]
        assert_same_batches(
            [r.batch.arrays() for r in rest], [w.batch.arrays() for w in whole[k + 1 :]]
        )


def test_named_components_continue_where_they_were_under_new_weights(parts):
    before = run_pipeline(_spec(parts, (0.5, 0.3, 0.2), shuffle=False), limit=40)
    state = json.dumps(before[-1].state).encode()
    after_spec = _spec(parts, (0.1, 0.1, 0.8), shuffle=False)
    after = run_pipeline(after_spec, state, limit=200)
    assert after[0].seq == before[-1].seq + 1
    docs = _docs(before) + _docs(after)
    for c, n in enumerate(SIZES):  # unshuffled: each component's documents in file order
        mine = [j for k, j in docs if k == c]
        assert mine == [i % n for i in range(len(mine))], c
    # The new shares hold from the resume on.
    tail = np.array([c for c, _ in _docs(after)])
    assert abs((tail == 2).mean() - 0.8) < 0.01
    # And a state of the resumed stream resumes it exactly.
    again = run_pipeline(after_spec, json.dumps(after[50].state).encode(), limit=20)
    assert_same_batches([a.batch.arrays() for a in again], [a.batch.arrays() for a in after[51:71]])


def test_a_state_from_another_mixture_is_refused_naming_what_differs(parts, tmp_path):
    state = json.dumps(run_pipeline(_spec(parts, (1, 1, 1)), limit=2)[-1].state).encode()
    from input_server.errors import InvalidSpecError

    tables = _spec(parts, (1, 1, 1)).to_dict()
    tables["source"] = [{**s, "name": f"q{i}"} for i, s in enumerate(tables["source"])]
    renamed = PipelineSpec.from_dict(tables)
    with pytest.raises(InvalidSpecError, match=r"\['p0', 'p1', 'p2'\] are not in this spec"):
        run_pipeline(renamed, state)
    unnamed = _spec(parts, (1, 1, 1), names=False)
    unnamed_state = json.dumps(run_pipeline(unnamed, limit=2)[-1].state).encode()
    with pytest.raises(InvalidSpecError, match="name every component"):
        run_pipeline(_spec(parts, (1, 2, 1), names=False), unnamed_state)
    one = PipelineSpec(
        source={"paths": [parts[0]], "token_field": "ids"},
        tokenizer={"vocab_size": VOCAB, "add_bos": False, "add_eos": False},
        workers={"count": 0},
    )
    with pytest.raises(InvalidSpecError, match="resume_state"):
        run_pipeline(one, state)


def test_a_mixture_streams_from_the_server_like_the_pipeline(parts, client):
    spec = _spec(parts, (0.5, 0.3, 0.2), epochs=1)
    want = run_pipeline(spec)
    got = list(client.batches(spec))
    assert len(got) == len(want)
    assert_same_batches(got, [w.arrays for w in want])


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda m: setattr(m.mixture[0], "weight", -1.0), "source[0].weight"),
        (lambda m: setattr(m.mixture[1], "weight", float("nan")), "source[1].weight"),
        (lambda m: setattr(m.mixture[2], "name", "p0"), "source[2].name"),
        (lambda m: m.source.paths.append("x.jsonl"), "source"),
    ],
    ids=["negative-weight", "nan-weight", "duplicate-name", "source-and-mixture"],
)
def test_the_server_refuses_a_bad_mixture_naming_the_key(parts, target, change, key):
    from tests.support import raw_messages

    msg = _spec(parts, (1, 1, 1)).to_proto()
    assert isinstance(msg, pb.PipelineSpec)
    change(msg)
    with pytest.raises(grpc.RpcError) as e:
        raw_messages(target, msg)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"`{key}`" in e.value.details()


def test_an_id_outside_the_vocabulary_is_data_loss_naming_file_record_and_id(tmp_path, client):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps({"ids": [1, 2, 3]}) + "\n" for _ in range(20)))
    with open(path, "a") as f:
        f.write(json.dumps({"ids": [4, VOCAB + 5, 6]}) + "\n")
    spec = PipelineSpec(
        source={"paths": [str(path)], "token_field": "ids"},
        tokenizer={"vocab_size": VOCAB, "bos_id": 1, "eos_id": 2},
        batch={"seq_len": 16, "size": 2},
        order={"shuffle": False},
        workers={"count": 0},
    )
    with pytest.raises(StreamError) as e:
        list(client.batches(spec))
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert "bad.jsonl line 21" in str(e.value) and str(VOCAB + 5) in str(e.value)


@pytest.mark.parametrize(
    "tokenizer, key",
    [
        ({"add_bos": False, "add_eos": False}, "tokenizer.vocab_size"),
        ({"vocab_size": 100, "add_eos": False}, "tokenizer.bos_id"),
        ({"vocab_size": 100, "bos_id": 1, "eos_id": 100}, "tokenizer.eos_id"),
        ({"vocab_size": 100, "bos_id": 1, "eos_id": 2, "pad_id": 100}, "tokenizer.pad_id"),
        ({"model": "m.model", "vocab_size": 100}, "tokenizer.vocab_size"),
    ],
)
def test_the_vocabulary_without_a_model_must_be_said(tokenizer, key):
    from input_client import SpecError

    with pytest.raises(SpecError) as e:
        PipelineSpec(source={"paths": ["a.jsonl"], "token_field": "ids"}, tokenizer=tokenizer)
    assert e.value.key == key


def test_text_without_a_model_names_the_model_key():
    from input_client import SpecError

    with pytest.raises(SpecError) as e:
        PipelineSpec(
            source=[{"paths": ["a"], "token_field": "ids"}, {"paths": ["b"]}],
            tokenizer={"vocab_size": 100, "add_bos": False, "add_eos": False},
        )
    assert e.value.key == "tokenizer.model" and "source[1]" in str(e.value)


def _tokens(batches) -> list[int]:
    """Every real token, row after row (ids are never 0; padding is)."""
    return [int(t) for b in batches for row in b.batch.inputs for t in row if t]


def _parse(tokens: list[int]) -> list[tuple[int, int]]:
    """The documents a token stream holds, checking each one whole (see `parts`); a last one
    the stream cut is left out."""
    docs, i = [], 0
    while i + 1 < len(tokens):
        c, j = tokens[i] - 1, tokens[i + 1] - 1
        n = 5 + j % 40
        if i + 2 + n > len(tokens):
            break
        assert tokens[i + 2 : i + 2 + n] == [9] * n, f"document {c, j} is not whole at {i}"
        docs.append((c, j))
        i += 2 + n
    return docs


def test_a_document_begun_before_new_weights_is_finished_first(parts):
    def spec(weights):
        s = _spec(parts, weights, shuffle=False)
        return s.replace(batch={"packing": "concat_then_split", "seq_len": 32, "size": 2})

    before = run_pipeline(spec((0.5, 0.3, 0.2)), limit=60)
    k = next(i for i, b in enumerate(before) if b.state["offset"] > 0 and i > 20)
    after = run_pipeline(spec((0.2, 0.2, 0.6)), json.dumps(before[k].state).encode(), limit=100)
    # The begun document's component comes first in the new interleave.
    assert after[0].state["mixture"]["origin"] > 0
    docs = _parse(_tokens(before[: k + 1]) + _tokens(after))
    assert len(docs) > 100
    for c, n in enumerate(SIZES):  # each component's documents once each, in file order
        mine = [j for k_, j in docs if k_ == c]
        assert mine == [i % n for i in range(len(mine))], c


def test_the_last_batchs_state_resumes_to_the_end(parts):
    spec = _spec(parts, (0.5, 0.3, 0.2), epochs=1)
    whole = run_pipeline(spec)
    assert run_pipeline(spec, json.dumps(whole[-1].state).encode()) == []


@pytest.mark.parametrize(
    "forge",
    [
        lambda m: m.update(quotas=[10**8, 10**8, 1]),
        lambda m: m.update(quotas=[2**40, 3, 3]),
        lambda m: m.update(quotas=[0, 3, 2]),
        lambda m: m.update(bases=[-(2**62), 0, 0]),
        lambda m: m.update(bases=[10**30, 0, 0]),
        lambda m: m.update(origin=10),
        lambda m: m.update(origin=-1),
        lambda m: m.update(bases=[0, 0]),
        lambda m: m.update(quotas="5,3,2"),
        lambda m: m.pop("bases"),
    ],
    ids=[
        "huge-quotas", "2^40-quota", "zero-quota", "base-far-below", "base-past-int64",
        "origin-past-period", "negative-origin", "too-few-bases", "quotas-not-a-list",
        "no-bases",
    ],
)  # fmt: skip
def test_a_forged_mixture_state_is_invalid_argument(parts, forge):
    from input_server.errors import InvalidSpecError

    spec = _spec(parts, (0.5, 0.3, 0.2))
    state = run_pipeline(spec, limit=3)[-1].state
    forge(state["mixture"])
    for weights in ((0.5, 0.3, 0.2), (0.1, 0.1, 0.8)):  # as it is, and to be rebased
        with pytest.raises(InvalidSpecError, match="resume_state"):
            run_pipeline(_spec(parts, weights), json.dumps(state).encode(), limit=1)


def test_an_offset_at_a_finished_mixtures_end_is_refused(parts):
    from input_server.errors import InvalidSpecError

    concat = {"packing": "concat_then_split"}
    spec = _spec(parts, (0.5, 0.3, 0.2), epochs=1).replace(batch=concat)
    state = run_pipeline(spec)[-1].state
    state["offset"] = 5
    other = _spec(parts, (0.1, 0.1, 0.8), epochs=1).replace(batch=concat)
    with pytest.raises(InvalidSpecError, match="documents end there"):
        run_pipeline(other, json.dumps(state).encode())


def test_huge_weights_are_refused_naming_the_key():
    from input_client import SpecError

    for weight in (1e308, 10**400):
        with pytest.raises(SpecError) as e:
            PipelineSpec(
                source=[{"paths": ["a"], "weight": weight}, {"paths": ["b"], "weight": weight}],
                tokenizer={"model": "m"},
            )
        assert e.value.key == "source[0].weight"


def test_a_components_mistake_names_its_key(parts, tmp_path, spm_model):
    from input_server.errors import DataNotFoundError, InvalidSpecError
    from tests.support import write_parquet

    text = write_parquet(tmp_path / "t.parquet", ["some text"] * 5)

    def spec(second):
        return PipelineSpec(
            source=[{"paths": [text], "format": "parquet"}, second],
            tokenizer={"model": spm_model},
            workers={"count": 0},
        )

    with pytest.raises(DataNotFoundError, match=r"`source\[1\]\.paths`: the glob"):
        run_pipeline(spec({"paths": [str(tmp_path / "none*.jsonl")]}), limit=1)
    with pytest.raises(InvalidSpecError, match=r"`source\[1\]\.text_field` 'body'"):
        run_pipeline(spec({"paths": [text], "format": "parquet", "text_field": "body"}), limit=1)
