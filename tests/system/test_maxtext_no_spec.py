"""Real MaxText 0.2.5 with MaxText's own command line and only the launcher and `--server`
added: no spec file. Each run trains from data named by MaxText's keys (a `grain_train_files`
mixture with a checkpoint and an exact restore, pre-tokenized ArrayRecord with
`tokenize_train_data=false`, `tokenizer_type=huggingface`, `tokenizer_type=tiktoken`), and every
step's `total_weights` equals the server's batches for the spec the launcher derived, counted
by MaxText's rule (targets_segmentation != 0, the pad id as MaxText takes it).

Skip locally with `-m "not maxtext"`; CI runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from input_client import PipelineSpec
from input_server.data.tf_example import make_example
from input_server.data.tokenizers.trainers import (
    train_hf_tokenizer,
    train_sentencepiece,
    write_tiktoken_model,
)
from tests.support import TINY_MAXTEXT, write_arrayrecord
from tests.support.maxtext import step_weights, total_weights

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]

SEQ, ROWS = 128, 4
MODEL = [*TINY_MAXTEXT, f"max_target_length={SEQ}", f"per_device_batch_size={ROWS}"]
DERIVED = re.compile(r"input_client\.maxtext: the train spec derived from MaxText's config: (.*)")


@pytest.fixture(scope="module")
def data(tmp_path_factory, docs):
    """Train files as MaxText's Grain pipeline reads them by default: ArrayRecord of
    tf.train.Example with a `text` feature, in two globs; and a model of every kind."""
    d = tmp_path_factory.mktemp("no-spec")
    for name, part in (("a", docs[:500]), ("b", docs[500:1200])):
        for i in range(2):
            write_arrayrecord(
                d / f"{name}-{i}.array_record", [make_example(text=t) for t in part[i::2]]
            )
    models = {
        "sentencepiece": train_sentencepiece(docs, d / "spm", vocab_size=1000, with_pad=False),
        "huggingface": train_hf_tokenizer(docs, d / "hf", vocab_size=1000, with_pad=False),
        "tiktoken": write_tiktoken_model(docs, d / "llama.tiktoken", vocab_size=1000),
    }
    return d, models


def _run(python, server, d, run, *args, steps=6):
    argv = [
        python,
        "-m",
        "input_client.maxtext.train",
        "--server",
        server.targets[0],
        "--connect-timeout-s",
        "3",
        f"run_name={run}",
        f"base_output_directory={d / 'out'}",
        *MODEL,
        f"steps={steps}",
        "skip_jax_distributed_system=true",
        *args,
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DECOUPLE_GCLOUD": "TRUE"}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "Traceback" not in out.stderr, out.stderr[-4000:]
    return out.stderr


def _derived(log: str) -> PipelineSpec:
    found = DERIVED.findall(log)
    assert found, log[-3000:]
    return PipelineSpec.from_dict(json.loads(found[-1]))


def test_a_mixture_of_globs_trains_checkpoints_and_restores_exactly(maxtext_python, server, data):
    d, models = data
    mixture = [
        f"grain_train_files={d}/a-*.array_record,0.3;{d}/b-*.array_record,0.7",
        f"tokenizer_path={models['sentencepiece']}",
        "enable_checkpointing=true",
        "async_checkpointing=false",
        "checkpoint_period=4",
    ]
    first = _run(maxtext_python, server, d, "mix", *mixture, steps=6)
    spec = _derived(first)
    # Grain's own integer proportions of MaxText's rounded weights (the smallest made 100).
    assert spec.is_mixture and [s.weight for s in spec.sources] == [100, 233]
    assert [s.paths for s in spec.sources] == [
        (f"{d}/a-*.array_record",),
        (f"{d}/b-*.array_record",),
    ]
    want = total_weights(spec, server, 10, pad_id=-1)
    assert [w for _, w in sorted(step_weights(first).items())] == want[:6]
    # The same command with more steps restores step 5's checkpoint, data position included.
    again = _run(maxtext_python, server, d, "mix", *mixture, steps=10)
    assert "restoring from this run's directory step 5" in again
    assert step_weights(again) == {s: want[s] for s in range(6, 10)}


def test_pre_tokenized_arrayrecord_with_tokenize_train_data_false(
    maxtext_python, server, data, docs
):
    import sentencepiece as spm

    d, models = data
    ids = spm.SentencePieceProcessor(model_file=models["sentencepiece"]).encode(docs[:600])
    write_arrayrecord(d / "ids.array_record", [make_example(ids=x) for x in ids])
    log = _run(
        maxtext_python,
        server,
        d,
        "ids",
        f"grain_train_files={d}/ids.array_record",
        f"tokenizer_path={models['sentencepiece']}",
        "tokenize_train_data=false",
        "train_data_columns=['ids']",
    )
    spec = _derived(log)
    assert spec.source.token_field == "ids" and not spec.tokenizer.add_bos
    assert [w for _, w in sorted(step_weights(log).items())] == total_weights(
        spec, server, 6, pad_id=-1
    )


@pytest.mark.parametrize(("kind", "pad_id"), [("huggingface", 0), ("tiktoken", -1)])
def test_trains_with_each_tokenizer_type(maxtext_python, server, data, kind, pad_id):
    """pad ids as MaxText's `get_tokenizer_and_pad_id` takes them: the Hugging Face model has
    no pad and no unk token (so 0, its BOS), tiktoken's is -1."""
    d, models = data
    log = _run(
        maxtext_python,
        server,
        d,
        kind,
        f"grain_train_files={d}/b-*.array_record",
        f"tokenizer_type={kind}",
        f"tokenizer_path={models[kind]}",
    )
    spec = _derived(log)
    assert spec.tokenizer.kind == kind
    assert [w for _, w in sorted(step_weights(log).items())] == total_weights(
        spec, server, 6, pad_id
    )
