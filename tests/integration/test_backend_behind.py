"""A request's stream whose fast tokenizer backend is not loaded in the server yet starts on the
reference and switches once the backend has loaded and passed the gate (`Router.load_behind`):
the same bytes as a reference-only stream; its info says which backend served which groups; a
worker process is handed the backend chosen, not the reference it started on."""

from __future__ import annotations

import pickle
import re
import time

import pytest

from input_client import InputClient, PipelineSpec
from input_client.spec import TokenizerSpec
from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl
from input_server.data.tokenizers import behind, load_tokenizer
from input_server.data.tokenizers.trainers import write_tiktoken_model
from input_server.serving.config import ServerConfig
from input_server.serving.server import Server
from tests.support import assert_same_batches

SERVED = re.compile(r"the reference served the first (\d+) groups while it loaded")


def _newest(client: InputClient):
    """The newest stream's info (the stream before may still be closing)."""
    return max(client.info().streams, key=lambda s: s.stream_id)


def _chosen(client: InputClient):
    """The newest stream's info once its backend is chosen (at most 60 s)."""
    deadline = time.monotonic() + 60
    while (info := _newest(client)).tokenizer_backend_pending:
        assert time.monotonic() < deadline, info.tokenizer_backend_why
        time.sleep(0.02)
    return info


@pytest.mark.parametrize("processes", [0, 2])
def test_a_stream_starts_on_the_reference_while_its_backend_loads(tmp_path, short_tmp, processes):
    texts = stdlib_docstrings(500)
    # Ranks of this test alone: no other test's stream has loaded their backend in this process.
    vocab = 650 + processes
    model = write_tiktoken_model(texts[:300], tmp_path / "behind.tiktoken", vocab_size=vocab)
    auto = PipelineSpec(
        source={"paths": [write_jsonl(texts, tmp_path / "docs.jsonl")]},
        tokenizer={"model": model, "kind": "tiktoken"},
        batch={"seq_len": 128, "size": 4},
        order={"shuffle": False, "epochs": 1},
        workers={"count": processes},
    )
    config = ServerConfig(listen=[f"unix://{short_tmp}/s.sock"], tokenizer_audit_every=1)
    with Server(config) as srv, InputClient(srv.targets[0]) as client:
        with client.batches(auto) as it:
            got = [next(it)]
            first = _newest(client)
            at_first = first.tokenizer_backend_why
            chosen = _chosen(client)
            got += list(it)
        deadline = time.monotonic() + 60
        while sum(client.info().totals.stream_ends.values()) < 1:  # its counts are in
            assert time.monotonic() < deadline
            time.sleep(0.02)
        first_audited = client.info().totals.audited_groups
        in_process = auto.replace(workers={"count": 0})  # the same bytes (invariant 1)
        with client.batches(in_process.replace(tokenizer={"backend": "reference"})) as it:
            want = list(it)
        with client.batches(in_process) as it:  # the backend is loaded now: chosen at once
            next(it)
            later = _newest(client)
        totals = client.info().totals
    assert len(got) > 20
    assert_same_batches(got, want)
    assert at_first.startswith("while fastokens loads") or SERVED.search(at_first), at_first
    # Pending while the reference serves and fastokens loads; never once chosen.
    assert first.tokenizer_backend_pending == at_first.startswith("while "), at_first
    assert not chosen.tokenizer_backend_pending and not later.tokenizer_backend_pending
    assert chosen.tokenizer_backend == "fastokens", chosen.tokenizer_backend_why
    served = SERVED.search(chosen.tokenizer_backend_why)
    assert served, chosen.tokenizer_backend_why
    if processes:  # the workers were handed fastokens, chosen before they started: every
        assert not at_first.startswith("while ")  # group is its, audited
        assert int(served.group(1)) == 0 and first_audited > 0
    assert totals.audited_groups > 0 and totals.audit_mismatches == 0
    assert later.tokenizer_backend == "fastokens"
    assert "gave the reference's ids" in later.tokenizer_backend_why
    assert not SERVED.search(later.tokenizer_backend_why)


def test_a_tokenizer_pickled_while_its_backend_loads_is_handed_the_backend(tmp_path):
    """What a worker process is handed waits for the choice: not the reference it started on."""
    texts = stdlib_docstrings(300)
    model = write_tiktoken_model(texts, tmp_path / "pickled.tiktoken", vocab_size=640)
    tok = load_tokenizer(TokenizerSpec(model=model, kind="tiktoken"), load_behind=True)
    pending = tok.choose_backend(texts[:64])
    assert pending.why.startswith("while fastokens loads") and pending.pending
    copy = pickle.loads(pickle.dumps(tok))
    assert copy.choice.backend == "fastokens", copy.choice.why
    assert not copy.choice.pending
    assert copy.choice == tok.choice
    assert copy.encode(texts[:50]).same_ids(tok.encode(texts[:50]))


def test_the_backend_loads_once_the_reference_has_made_the_first_groups(tmp_path, monkeypatch):
    """Loaded beside a stream's first groups, a backend held them up: it waits for the
    reference's first LOAD_AFTER_GROUPS groups (here with no time limit to fall back on)."""
    monkeypatch.setattr(behind, "LOAD_AFTER_S", 600.0)
    texts = stdlib_docstrings(300)
    model = write_tiktoken_model(texts, tmp_path / "after.tiktoken", vocab_size=645)
    tok = load_tokenizer(TokenizerSpec(model=model, kind="tiktoken"), load_behind=True)
    loads = []  # when each load began: the groups the reference had finished by then
    load = type(tok.router).loaded_backend
    finished = 0

    def counted(router, name):
        loads.append(finished)
        return load(router, name)

    monkeypatch.setattr(type(tok.router), "loaded_backend", counted)
    assert tok.choose_backend(texts[:64]).pending
    for n in range(behind.LOAD_AFTER_GROUPS):
        time.sleep(0.5)  # time for a load that would not wait
        assert not loads and tok.choice.pending, f"loading after {n} groups: {tok.choice.why}"
        tok.encode(texts[50 * n : 50 * n + 50])
        finished += 1
    deadline = time.monotonic() + 60
    while tok.choice.pending:
        assert time.monotonic() < deadline, tok.choice.why
        time.sleep(0.02)
    assert tok.choice.backend == "fastokens", tok.choice.why
    assert SERVED.search(tok.choice.why), tok.choice.why
    assert loads and loads[0] >= behind.LOAD_AFTER_GROUPS, loads  # began once they were made
