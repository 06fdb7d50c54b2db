"""input_client.maxtext in real MaxText (0.2.5, its own Python 3.12 venv built by
scripts/tools/maxtext_venv.sh and cached): the launcher trains a tiny decoder from a real server
with checkpoints; a killed run restarted from its checkpoint repeats the same steps exactly; eval
passes repeat; two JAX processes read and resume their own shards; the batches equal MaxText's
own ShiftData/PadOrTrimToMaxLength applied to the same documents; mistakes stop in one line.

Skip locally with `-m "not maxtext"`; CI runs it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap

import pytest

from input_client import InputClient
from tests.support.maxtext import (
    ONE_HOST,
    STEPS,
    assert_one_launcher_line,
    launch,
    launch_two_hosts,
    logged_steps,
    total_weight,
    total_weights,
)

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]

EVAL_LINE = re.compile(
    r"Completed eval after train step (\d+), loss=([\d.]+), .*?"
    r"total_weights=([\d.]+)"
)
DATA_WAIT_LINE = re.compile(r"data_wait: [\d.]+ s, step: (\d+)")
EVAL_PASS = {"shuffle": False, "epochs": 1}  # what the adapter makes of any eval spec


def test_trains_checkpoints_restarts_and_evals(maxtext_python, server, specs):
    d, train, evals, model = specs
    metrics_file = d / "whole-metrics.jsonl"
    a = launch(  # async checkpoints
        maxtext_python, server, d, model, "whole", *ONE_HOST, f"metrics_file={metrics_file}"
    )
    assert a.returncode == 0, a.stderr[-4000:]
    whole = logged_steps(a.stderr)
    assert sorted(whole) == list(range(STEPS))
    # Each step's wait for its batch, in MaxText's log and in its own metrics file.
    assert sorted(int(s) for s in DATA_WAIT_LINE.findall(a.stderr)) == list(range(STEPS))
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    train_rows = [r for r in rows if "learning/loss" in r]
    # MaxText empties its metrics file whenever it writes a step 0, and each eval pass's
    # running metrics start at step 0: the train rows left are those after the last eval (10).
    assert [r["step"] for r in train_rows] == list(range(10, STEPS))
    assert all(r["perf/data_wait_seconds"] >= 0 for r in train_rows)
    # MaxText trained on the server's batches, in order, weighted by MaxText's rule.
    assert [whole[s][0] for s in range(STEPS)] == total_weights(train, server, STEPS)
    # Eval after steps 0 and 10: the same single pass in order both times (within eval_steps).
    evals_seen = EVAL_LINE.findall(a.stderr)
    assert [int(s) for s, _, _ in evals_seen] == [0, 10]
    one_pass = total_weights(evals.replace(order=EVAL_PASS), server)
    assert len(one_pass) < 50
    assert {float(w) for _, _, w in evals_seen} == {float(sum(one_pass))}
    for step in (10, 19):  # async checkpoints carry the data position too
        saved = d / "out" / "whole" / "checkpoints" / str(step) / "iter" / "process_0-of-1.json"
        assert json.loads(saved.read_text())["seq"] == step + 1

    # A second run, killed once step 12 is logged (after the checkpoint of step 10)...
    b = launch(
        maxtext_python, server, d, model, "killed", *ONE_HOST, stream=True, sync_checkpoints=True
    )
    try:
        for line in b.stderr:
            if "completed step: 12," in line:
                os.killpg(b.pid, signal.SIGKILL)
                break
        b.wait(timeout=60)
    finally:
        if b.poll() is None:
            os.killpg(b.pid, signal.SIGKILL)
    assert b.returncode == -signal.SIGKILL
    checkpoints = d / "out" / "killed" / "checkpoints"
    saved = sorted(int(p) for p in os.listdir(checkpoints) if p.isdigit())
    assert 10 <= saved[-1] < STEPS - 1
    assert (checkpoints / str(saved[-1]) / "iter" / "process_0-of-1.json").is_file()
    # ... and restarted: it continues from its checkpoint with the model and data as they were.
    c = launch(maxtext_python, server, d, model, "killed", *ONE_HOST)
    assert c.returncode == 0, c.stderr[-4000:]
    assert f"restoring from this run's directory step {saved[-1]}" in c.stderr
    resumed = logged_steps(c.stderr)
    assert sorted(resumed) == list(range(saved[-1] + 1, STEPS))
    assert {s: whole[s] for s in resumed} == resumed  # loss, perplexity and total_weights


def test_trains_without_packing(maxtext_python, server, specs):
    d, train, _, model = specs
    out = launch(
        maxtext_python,
        server,
        d,
        model,
        "unpacked",
        *ONE_HOST,
        "packing=false",
        spec="unpacked",
        steps=4,
        evaluate=False,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    steps = logged_steps(out.stderr)
    assert [steps[s][0] for s in range(4)] == total_weights(
        train.replace(batch={"packing": "none"}), server, 4
    )


def test_trains_on_a_mixture_with_a_pre_tokenized_arrayrecord_component(
    maxtext_python, server, specs, docs
):
    import sentencepiece as spm
    from array_record.python import array_record_module

    from input_server.data.tf_example import make_example

    d, train, _, model = specs
    ids = spm.SentencePieceProcessor(model_file=model).encode(docs[:400])
    records = str(d / "ids.array_record")
    writer = array_record_module.ArrayRecordWriter(records, "group_size:1")
    for x in ids:
        writer.write(make_example(ids=x))
    writer.close()
    mixture = train.replace(
        source=[
            {**train.source.to_dict(), "name": "text", "weight": 0.6},
            {
                "paths": [records],
                "format": "arrayrecord",
                "record_format": "tf_example",
                "token_field": "ids",
                "name": "ids",
                "weight": 0.4,
            },
        ]
    )
    (d / "mixture.toml").write_text(mixture.to_toml())
    out = launch(
        maxtext_python, server, d, model, "mixture", *ONE_HOST, spec="mixture", steps=4,
        evaluate=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    steps = logged_steps(out.stderr)
    assert [steps[s][0] for s in range(4)] == total_weights(mixture, server, 4)


def test_mistakes_stop_in_one_line(maxtext_python, server, specs):
    d, _, _, model = specs
    assert_one_launcher_line(
        launch(
            maxtext_python,
            server,
            d,
            model,
            "mismatch",
            *ONE_HOST,
            "max_target_length=128",
            evaluate=False,
        ),
        2,
        "`batch.seq_len` is 256",
        "`max_target_length` is 128",
    )
    assert_one_launcher_line(
        launch(
            maxtext_python,
            server,
            d,
            model,
            "nowhere",
            *ONE_HOST,
            evaluate=False,
            address=f"unix://{d}/nowhere.sock",
        ),
        2,
        "no input server reachable",
    )
    no_eval = launch(
        maxtext_python, server, d, model, "no-eval", *ONE_HOST, evaluate=False, steps=3
    )
    assert no_eval.returncode == 0, no_eval.stderr[-3000:]  # eval_interval=-1 needs no spec
    assert_one_launcher_line(
        launch(
            maxtext_python,
            server,
            d,
            model,
            "eval-without-spec",
            *ONE_HOST,
            "eval_interval=2",
            evaluate=False,
        ),
        2,
        "no eval spec was given",
    )
    assert_one_launcher_line(
        launch(
            maxtext_python, server, d, model, "missing", *ONE_HOST, spec="missing", evaluate=False
        ),
        1,
        "the data stream failed: NOT_FOUND",
        "no-such.jsonl",
    )


def test_two_hosts_each_read_their_shard_and_resume_it(maxtext_python, server, specs):
    d, train, _, model = specs
    shards = [
        total_weights(train.replace(shard={"index": i, "count": 2}), server, 14) for i in (0, 1)
    ]
    want = [a + b for a, b in zip(*shards, strict=True)]  # MaxText logs the global batch's sum
    logs = launch_two_hosts(maxtext_python, server, d, model, "hosts", 12)
    assert logged_steps(logs[0]) == logged_steps(logs[1])  # one global step, two logs
    first = logged_steps(logs[0])
    assert [first[s][0] for s in range(12)] == want[:12]
    iters = d / "out" / "hosts" / "checkpoints" / "11" / "iter"
    states = [json.loads((iters / f"process_{i}-of-2.json").read_text()) for i in (0, 1)]
    assert states[0]["seq"] == states[1]["seq"] == 12
    assert states[0]["fingerprint"] != states[1]["fingerprint"]  # each host's own shard
    # Both restart from step 11's checkpoint, each at its own shard's position.
    again = logged_steps(launch_two_hosts(maxtext_python, server, d, model, "hosts", 14)[0])
    assert [again[s][0] for s in (12, 13)] == want[12:14]


CONVENTIONS = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from maxtext.input_pipeline.input_pipeline_utils import PadOrTrimToMaxLength, ShiftData
    from input_client import InputClient, PipelineSpec
    from input_client.maxtext.conventions import to_maxtext
    server, pad_id, seq, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    spec = PipelineSpec.from_dict(json.loads(sys.argv[5]))
    shift = ShiftData(ignored_ids=[pad_id], axis=1)
    checked = partial = 0
    with InputClient(server) as c, c.batches(spec) as it:
        for b in it:
            seg = np.asarray(b["inputs_segmentation"])
            if spec.batch.packing == "none":  # MaxText pads each document, then the batch
                docs = [np.asarray(b["inputs"])[r][seg[r] > 0] for r in range(rows)
                        if seg[r].any()]
                pre = [PadOrTrimToMaxLength(seq, pad_id).map({"inputs": d, "targets": d.copy()})
                       for d in docs]
            else:  # Grain's packer gave these rows (0 padding); MaxText pads the batch
                pre = [{"inputs": b["inputs"][r], "inputs_segmentation": seg[r],
                        "inputs_position": b["inputs_position"][r], "targets": b["inputs"][r],
                        "targets_segmentation": seg[r], "targets_position":
                        b["inputs_position"][r]} for r in range(rows) if seg[r].any()]
            batch = {k: np.stack([np.asarray(p[k], np.int32) for p in pre]
                                 + [np.full(seq, pad_id, np.int32)] * (rows - len(pre)))
                     for k in pre[0]}
            want = shift.map(batch)
            got = to_maxtext(b, pad_id, spec.batch.packing)
            assert sorted(got) == sorted(want), (sorted(got), sorted(want))
            for k in want:
                assert np.array_equal(got[k], want[k]), (checked, k, got[k], want[k])
            checked += 1
            partial += len(pre) < rows
    print(checked, partial, flush=True)
    # The result is out. Once in CI this process then hung past 300 s in interpreter
    # teardown (MaxText's imports: JAX, transformers); the client had closed its stream and
    # channel, and a client closed so leaves no thread behind (checked by hand on this
    # stream's shape). What is under test here is the batches, so the process ends now.
    os._exit(0)
""")


@pytest.mark.parametrize("packing", ["first_fit", "none"])
@pytest.mark.parametrize("pad_id", [-1, 0])
def test_batches_equal_maxtexts_own_transforms(maxtext_python, server, specs, packing, pad_id):
    _, _, evals, _ = specs

    def empty_rows_at_the_end(rows: int) -> bool:
        spec = evals.replace(
            batch={"seq_len": 64, "size": rows, "packing": packing}, order=EVAL_PASS
        )
        with InputClient(server.targets[0]) as c, c.batches(spec) as it:
            *_, last = it
        return not last["inputs_segmentation"].any(axis=1).all()

    # A batch size whose pass ends in a batch with rows of padding, as a real pass usually does.
    rows = next(r for r in range(8, 2, -1) if empty_rows_at_the_end(r))
    spec = evals.replace(batch={"seq_len": 64, "size": rows, "packing": packing}, order=EVAL_PASS)
    out = subprocess.run(
        [
            maxtext_python,
            "-c",
            CONVENTIONS,
            server.targets[0],
            str(pad_id),
            "64",
            str(rows),
            json.dumps(spec.to_dict()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    checked, partial = map(int, out.stdout.strip().splitlines()[-1].split())
    assert checked > 3 and partial == 1  # the last batch has rows of padding, as MaxText's


FACTORY = textwrap.dedent("""
    import json, sys, types
    import jax, numpy as np
    from input_client import maxtext
    server, spec, model = sys.argv[1:4]
    maxtext.install(server, spec)
    config = types.SimpleNamespace(
        max_target_length=256, global_batch_size_to_load=8, add_bos=True, add_eos=True,
        vocab_size=8192, tokenizer_type="sentencepiece", tokenizer_path=model,
        expansion_factor_real_data=-1, packing=False, grain_packing_type="first_fit",
        max_segments_per_seq=-1, use_truncation=True, generate_padding_batch_train=False)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    it = maxtext.make_train_iterator(config, mesh, [0])
    batch = {k: np.asarray(v) for k, v in next(it).items()}
    padding = batch["inputs_segmentation"] <= 0
    print(json.dumps({k: sorted(set(batch[k][padding].tolist())) for k in batch}))
""")


def test_the_pad_id_comes_from_the_servers_description_of_the_model(maxtext_python, server, specs):
    # Through install() and MaxText's own MultiHostDataLoadIterator: the model has no pad
    # piece, so unpacked rows are padded with -1, as MaxText's PadOrTrimToMaxLength pads.
    d, _, _, model = specs
    out = subprocess.run(
        [maxtext_python, "-c", FACTORY, server.targets[0], str(d / "unpacked.toml"), model],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    values = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("inputs", "inputs_segmentation", "inputs_position", "targets", "targets_position"):
        assert values[key] == [-1], (key, values[key])
    assert values["targets_segmentation"] == [0]


def test_a_moved_hook_point_is_refused_naming_the_version(maxtext_python):
    # A later MaxText that no longer reads this name where the adapter sets it (stood in for by
    # removing it) must fail before training, saying which MaxText it found.
    code = textwrap.dedent("""
        from maxtext.input_pipeline import input_pipeline_interface as ipi
        del ipi.make_grain_eval_iterator
        from input_client import PipelineSpec, maxtext
        spec = PipelineSpec(source={"paths": ["x.jsonl"]}, tokenizer={"model": "m.model"})
        try:
            maxtext.install("unix:///nowhere.sock", spec)
        except maxtext.MaxTextHookError as e:
            print(e)
    """)
    out = subprocess.run(
        [maxtext_python, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DECOUPLE_GCLOUD": "TRUE"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    message = out.stdout.strip().splitlines()[-1]
    assert "MaxText 0.2.5" in message and "make_grain_eval_iterator" in message
    assert "tested with MaxText 0.2.5" in message


def test_fans_in_from_two_servers_and_resumes_both_from_its_checkpoint(
    maxtext_python, server, specs, tmp_path
):
    from input_server.serving.server import Server, ServerConfig

    d, train, _, model = specs
    second = Server(ServerConfig(listen=[f"unix://{tmp_path}/second.sock"]))
    pool = [server.targets[0], second.targets[0]]
    try:
        with InputClient(pool) as c, c.batches(train) as it:  # the fanned-in stream itself
            want = []
            for b in it:
                want.append(total_weight(b, train.batch.packing))
                if len(want) == 15:
                    break
        a = launch(
            maxtext_python, server, d, model, "fanin", *ONE_HOST, steps=10,
            evaluate=False, sync_checkpoints=True, address=",".join(pool),
        )  # fmt: skip
        assert a.returncode == 0, a.stderr[-4000:]
        first = logged_steps(a.stderr)
        assert [first[s][0] for s in range(10)] == want[:10]
        saved = d / "out" / "fanin" / "checkpoints" / "5" / "iter" / "process_0-of-1.json"
        state = json.loads(saved.read_text())
        assert state["seq"] == 6 and state["fan_in"]["servers"] == 2
        # The same run to step 15: it restores step 9's checkpoint, both servers' positions.
        b = launch(
            maxtext_python, server, d, model, "fanin", *ONE_HOST, steps=15,
            evaluate=False, sync_checkpoints=True, address=",".join(pool),
        )  # fmt: skip
        assert b.returncode == 0, b.stderr[-4000:]
        resumed = logged_steps(b.stderr)
        assert sorted(resumed) == list(range(10, 15))
        assert [resumed[s][0] for s in range(10, 15)] == want[10:]
    finally:
        second.stop(0)
