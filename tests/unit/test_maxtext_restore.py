"""A checkpoint step written by another number of processes, restored: the step's
`process_{i}-of-{n}.json` states found and resharded (`input_client.checkpoint.load_state`),
through our Orbax handler and through the checkpointable the MaxText adapter gives MaxText;
what is refused, in one line. tests/system/test_maxtext_elastic.py runs it in real MaxText."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import numpy as np
import pytest

from input_client import InputClient, PipelineSpec, reshard
from input_client.checkpoint import load_state
from input_client.maxtext import MaxTextConfigError
from input_client.wire import encode_state
from input_server.data.builtin_corpora import write_jsonl


@pytest.fixture(scope="module")
def epoch(docs, spm_model, tmp_path_factory) -> PipelineSpec:
    """One shuffled pass over 120 real documents (inside the test server's root)."""
    d = tmp_path_factory.mktemp("elastic")
    return PipelineSpec(
        source={"paths": [write_jsonl(docs[:120], d / "epoch.jsonl")]},
        tokenizer={"model": spm_model},
        batch={"seq_len": 128, "size": 4},
        order={"epochs": 1, "seed": 11},
        workers={"count": 0},
    )


def _read(server, spec, state=None, n=None):
    """(the tokens of `spec`'s first `n` batches from `state` (all: None), the state after)."""
    tokens = Counter()
    with InputClient(server.targets[0]) as c, c.batches(spec, state=state) as it:
        for k, b in enumerate(it, 1):
            tokens.update(np.asarray(b["inputs"])[np.asarray(b["inputs_segmentation"]) != 0])
            if k == n:
                break
        return tokens, it.get_state()


def _shard(spec, i, count):
    return spec.replace(shard={"index": i, "count": count})


@pytest.fixture(scope="module")
def two_hosts(server, epoch):
    """Hosts 0 and 1 of 2 after 3 and 2 batches: (their tokens, their states)."""
    read = [_read(server, _shard(epoch, i, 2), n=n) for i, n in ((0, 3), (1, 2))]
    return [t for t, _ in read], [s for _, s in read]


def _write(folder, states, count, text=lambda s: json.dumps(s)):
    folder.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(states):
        (folder / f"process_{i}-of-{count}.json").write_text(text(s))
    return folder


def test_our_orbax_handler_restores_two_processes_step_on_one(server, epoch, two_hosts, tmp_path):
    import orbax.checkpoint as ocp

    from input_client.checkpoint import InputStateRestore, InputStateSave

    tokens, states = two_hosts
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(5, args=ocp.args.Composite(data=InputStateSave(states[0])))
        mngr.wait_until_finished()
    # What two processes would have written (one test process cannot be two JAX processes).
    data = tmp_path / "ckpt" / "5" / "data"
    (data / "process_0-of-1.json").unlink()
    _write(data, states, 2)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        restored = mngr.restore(5, args=ocp.args.Composite(data=InputStateRestore())).data
    assert restored == reshard(states, 1)[0]
    rest, _ = _read(server, epoch, restored)
    # The old hosts' batches and the one new host's: every token of the epoch once.
    assert tokens[0] + tokens[1] + rest == _read(server, epoch)[0]


def test_one_processs_step_restores_on_two_as_maxtext_saves_it(server, epoch, tmp_path):
    # MaxText's file: get_state().decode(), i.e. the canonical JSON bytes as text.
    head, state = _read(server, epoch, n=4)
    folder = _write(tmp_path / "iter", [state], 1, lambda s: encode_state(s).decode())
    new = [load_state(folder, j, 2) for j in (0, 1)]
    assert new == reshard([state], 2)
    rest = [_read(server, _shard(epoch, j, 2), s)[0] for j, s in enumerate(new)]
    assert head + rest[0] + rest[1] == _read(server, epoch)[0]
    assert load_state(folder, 0, 1) == state  # its own file, as it is


def test_a_process_that_took_no_batch_is_resharded_as_none(server, epoch, tmp_path):
    head, state = _read(server, _shard(epoch, 0, 3), n=2)
    # MaxText saves {} and our handler null for a process that took no batch yet.
    folder = _write(tmp_path / "iter", [state, {}, None], 3)
    got = load_state(folder, 0, 1)
    assert got == reshard([state, None, None], 1)[0]
    assert head + _read(server, epoch, got)[0] == _read(server, epoch)[0]
    nobody = _write(tmp_path / "fresh", [{}, None], 2)
    assert load_state(nobody, 0, 1) is None  # nobody began: a fresh run on the new count


def test_the_maxtext_checkpointable_sets_the_resharded_state(server, epoch, two_hosts, tmp_path):
    from input_client.maxtext._resume import ServerStateCheckpointable
    from input_client.maxtext.source import ServerIterator

    _, states = two_hosts
    folder = _write(tmp_path / "iter", states, 2, lambda s: encode_state(s).decode())
    it = ServerIterator(lambda state: pytest.fail("opened"), pad_id=-1, packing="first_fit")
    asyncio.run(_load(ServerStateCheckpointable(it), folder))
    assert json.loads(it.get_state()) == reshard(states, 1)[0]  # this test is process 0 of 1
    (folder / "process_1-of-2.json").unlink()
    with pytest.raises(MaxTextConfigError) as e:
        asyncio.run(_load(ServerStateCheckpointable(it), folder))
    assert "cannot restore the data position" in str(e.value)
    assert "lacks process_1-of-2.json" in str(e.value) and "\n" not in str(e.value)


async def _load(checkpointable, folder):
    await (await checkpointable.load(folder))  # Orbax's two phases


def _refusal(folder, exc, index=0, count=1) -> str:
    with pytest.raises(exc) as e:
        load_state(folder, index, count)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def test_what_cannot_be_resharded_is_refused_in_one_line(server, epoch, two_hosts, tmp_path):
    _, states = two_hosts

    def folder(name, files):
        f = tmp_path / name
        f.mkdir()
        for file, state in files.items():
            (f / file).write_text(json.dumps(state))
        return f

    a, b = states
    empty = folder("empty", {})
    assert "process_0-of-1.json does not exist, nor any" in _refusal(empty, FileNotFoundError)
    missing = folder("missing", {"process_0-of-3.json": a, "process_2-of-3.json": b})
    message = _refusal(missing, FileNotFoundError)
    assert "lacks process_1-of-3.json of the 3 processes" in message
    # Ours is missing though the count is ours: a lost file, not another count.
    lost = folder("lost", {"process_1-of-2.json": b})
    assert "lacks process_0-of-2.json" in _refusal(lost, FileNotFoundError, 0, 2)
    mixed = folder(
        "mixed", {"process_0-of-2.json": a, "process_1-of-2.json": b, "process_0-of-3.json": a}
    )
    assert "written by 2 and 3 processes" in _refusal(mixed, ValueError)
    twice = folder(
        "twice", {"process_0-of-2.json": a, "process_1-of-2.json": b, "process_01-of-2.json": b}
    )
    message = _refusal(twice, ValueError)
    assert "process 1 of 2 more than once" in message
    assert "process_01-of-2.json and process_1-of-2.json" in message
    past = folder(
        "past", {"process_0-of-2.json": a, "process_1-of-2.json": b, "process_2-of-2.json": b}
    )
    assert "process_2-of-2.json (past 1)" in _refusal(past, ValueError)
    grain = folder("grain", {"process_0-of-2.json": a, "process_1-of-2.json": {"next_index": 3}})
    assert "holds no input server state" in _refusal(grain, ValueError)
    ours = folder("ours", {"process_0-of-1.json": {"next_index": 3}})  # even our own file
    assert "saved by another input pipeline" in _refusal(ours, ValueError)
    # A host's state given in the other's place: reshard's own message, with the folder's.
    swapped = folder("swapped", {"process_0-of-2.json": b, "process_1-of-2.json": a})
    message = _refusal(swapped, ValueError)
    assert f"the 2 data states in {swapped} do not reshard onto 1 processes" in message
    assert "out of place" in message
