"""Elastic resume in real MaxText (0.2.5): a run trained on 2 JAX processes restores its
checkpoint on 1 and continues, then on 2 again. MaxText's own checkpointing would refuse both
(fewer processes assert, more raise); the adapter reshards the step's `iter/process_*-of-*.json`
states (`input_client.reshard`). Each continued step's `total_weights` is the resharded
streams' own, and over the three runs one epoch of a finite spec is read exactly once.

Skip locally with `-m "not maxtext"`; CI runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections import Counter

import numpy as np
import pytest

from input_client import InputClient, reshard
from input_server.data.builtin_corpora import write_jsonl
from tests.support.maxtext import (
    ONE_HOST,
    assert_one_launcher_line,
    launch,
    launch_two_hosts,
    step_weights,
    total_weight,
)

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]

DOCS = 400  # one epoch: ~18 batches of 8 rows (~9 a shard of 2)
FIRST, SECOND = 4, 4  # steps on 2 processes, then on 1; then on 2 to the epoch's end
PAD = "generate_padding_batch_train=true"  # a host past its stream's end: rows of weight 0


def _read(spec, server, state=None, n=None):
    """`spec`'s batches from `state`: (each one's total_weights, the tokens they hold, the
    state after the last), the first `n` (all: None)."""
    weights, tokens = [], Counter()
    with InputClient(server.targets[0]) as c, c.batches(spec, state=state) as it:
        for b in it:
            weights.append(total_weight(b, spec.batch.packing))
            seg = np.asarray(b["inputs_segmentation"])
            tokens.update(np.asarray(b["inputs"])[seg != 0].tolist())
            if len(weights) == n:
                break
        return weights, tokens, it.get_state()


def _saved(d, run, step, count):
    folder = d / "out" / run / "checkpoints" / str(step) / "iter"
    names = sorted(p.name for p in folder.glob("process_*"))
    assert names == [f"process_{i}-of-{count}.json" for i in range(count)], names
    return [json.loads((folder / n).read_text()) for n in names]


def test_a_checkpoint_of_two_processes_continues_on_one_then_on_two(
    maxtext_python, server, specs, docs
):
    d, train, _, model = specs
    epoch = train.replace(
        source={"paths": [write_jsonl(docs[:DOCS], d / "epoch.jsonl")]}, order={"epochs": 1}
    )
    (d / "epoch.toml").write_text(epoch.to_toml())
    _, whole, _ = _read(epoch, server)  # one pass of the epoch, on one host

    def shard(j, count):
        return epoch.replace(shard={"index": j, "count": count})

    def run(processes, steps, name="elastic"):
        """MaxText's steps on `processes` processes, to `steps`: {step: total_weights}."""
        if processes == 2:
            log = launch_two_hosts(
                maxtext_python, server, d, model, name, steps, PAD, spec="epoch"
            )[0]
        else:
            out = launch(
                maxtext_python, server, d, model, name, *ONE_HOST, PAD,
                spec="epoch", steps=steps, evaluate=False, sync_checkpoints=True,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr[-4000:]
            log = out.stderr
        return step_weights(log)

    # 1. Two processes, FIRST steps: each reads its shard of 2.
    ran = run(2, FIRST)
    old = [_read(shard(i, 2), server, n=FIRST) for i in (0, 1)]
    assert ran == {s: old[0][0][s] + old[1][0][s] for s in range(FIRST)}
    states = _saved(d, "elastic", FIRST - 1, 2)
    assert states == [old[0][2], old[1][2]]  # what each host had read
    _a_lost_file_is_refused(maxtext_python, server, d, model, FIRST - 1)

    # 2. One process restores that step: both hosts' data states resharded onto one.
    ran = run(1, FIRST + SECOND)
    one = _read(epoch, server, reshard(states, 1)[0], SECOND)
    assert ran == {FIRST + k: w for k, w in enumerate(one[0])}
    states = _saved(d, "elastic", FIRST + SECOND - 1, 1)
    assert states == [one[2]]

    # 3. Two processes restore that step (one state, resharded onto two) and run to the end of
    # the epoch: as many steps as the longer stream left; the other host's rows are padding
    # (weight 0) once its stream ends.
    new = [_read(shard(j, 2), server, s) for j, s in enumerate(reshard(states, 2))]
    left = max(len(w) for w, _, _ in new)
    assert min(len(w) for w, _, _ in new) > 0
    ran = run(2, FIRST + SECOND + left)
    want = [sum(w[k] for w, _, _ in new if k < len(w)) for k in range(left)]
    assert ran == {FIRST + SECOND + k: w for k, w in enumerate(want)}
    # Each host's position at the end is its stream's end: nothing of it left unread.
    assert _saved(d, "elastic", FIRST + SECOND + left - 1, 2) == [s for _, _, s in new]

    # Every token of the epoch once over the three runs (MaxText took these batches: their
    # weights above, step by step): nothing read twice, nothing skipped.
    read = old[0][1] + old[1][1] + one[1] + new[0][1] + new[1][1]
    wrong = {t: (read[t], whole[t]) for t in set(read) | set(whole) if read[t] != whole[t]}
    assert not wrong, f"tokens read other than once (read, in the epoch): {wrong}"


def _a_lost_file_is_refused(python, server, d, model, step):
    """A copy of the run whose step lacks host 1's file: one process refuses it in one line."""
    shutil.copytree(d / "out" / "elastic", d / "out" / "lacking")
    (d / "out" / "lacking" / "checkpoints" / str(step) / "iter" / "process_1-of-2.json").unlink()
    out = launch(
        python, server, d, model, "lacking", *ONE_HOST, PAD,
        spec="epoch", steps=step + 3, evaluate=False,
    )  # fmt: skip
    assert_one_launcher_line(
        out, 2, "cannot restore the data position", "lacks process_1-of-2.json"
    )


MOVED = textwrap.dedent("""
    from maxtext.common import checkpointing, grain_utility
    from input_client import PipelineSpec, maxtext
    spec = PipelineSpec(source={"paths": ["x.jsonl"]}, tokenizer={"model": "m.model"})
    checkpointing.load_state_if_possible = lambda *args: None  # restores some other way
    for moved in ("checkpointing", "grain_utility"):
        if moved == "grain_utility":
            del grain_utility.for_restore
        try:
            maxtext.install("unix:///nowhere.sock", spec)
        except maxtext.MaxTextHookError as e:
            print(e)
""")


def test_a_moved_restore_hook_point_is_refused_naming_the_version(maxtext_python):
    # A later MaxText that restores its data iterator elsewhere (stood in for by replacing
    # the function that restores it, then removing the one the adapter wraps) fails before
    # training, naming the MaxText it found.
    out = subprocess.run(
        [maxtext_python, "-c", MOVED],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()[-2:]
    assert len(lines) == 2, out.stdout
    assert "load_state_if_possible no longer restores the data iterator" in lines[0]
    assert "grain_utility has no for_restore" in lines[1]
    assert all("MaxText 0.2.5" in m and "tested with MaxText 0.2.5" in m for m in lines)
