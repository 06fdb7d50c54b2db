"""Fixtures of the system tests that run real MaxText."""

from __future__ import annotations

import subprocess

import pytest

from input_client import PipelineSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.tokenizers.trainers import train_sentencepiece
from tests.support import ROOT, file_lock, python_or_skip, run_dir
from tests.support.maxtext import ROWS, SEQ
from tests.support.progress import run_saying_progress

SCRIPT = str(ROOT / "scripts" / "tools" / "maxtext_venv.sh")


@pytest.fixture(scope="session")
def maxtext_python(request) -> str:
    """The python of the cached MaxText 0.2.5 venv (scripts/tools/maxtext_venv.sh builds it once).
    A build (~2 GB, minutes) is said on the terminal, with its steps, past pytest's capture:
    a suite that goes quiet for minutes looks hung."""
    python_or_skip("3.12", "the MaxText venv")
    with file_lock(run_dir(request.config) / "maxtext-venv.lock"):  # one worker (or run) builds it
        return _built_venv(request)


def _built_venv(request) -> str:
    check = subprocess.run(["bash", SCRIPT, "--check"], capture_output=True, text=True)
    returncode, stdout, stderr = run_saying_progress(
        request.config, ["bash", SCRIPT], shown=check.returncode != 0
    )
    assert returncode == 0, stderr[-3000:]
    return stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def specs(tmp_path_factory, docs):
    """The launcher's spec files (`tests.support.maxtext.launch`'s folder): train (endless,
    shuffled), train without packing, and eval (150 documents, written shuffled and endless:
    the adapter must make it one pass in order) specs over real text, and a model without a
    pad piece (pad id -1, like Llama 2's), inside the test server's root."""
    d = tmp_path_factory.mktemp("maxtext")
    model = train_sentencepiece(docs, d / "nopad", vocab_size=1000, with_pad=False)
    train = PipelineSpec(
        source={"paths": [write_jsonl(docs, d / "train.jsonl")]},
        tokenizer={"model": model},
        batch={"seq_len": SEQ, "size": ROWS},
        order={"epochs": 0, "seed": 3},
    )
    evals = train.replace(
        source={"paths": [write_jsonl(docs[:150], d / "eval.jsonl")]},
        order={"epochs": 0, "shuffle": True, "seed": 5},
    )
    unpacked = train.replace(batch={"packing": "none"})
    missing = train.replace(source={"paths": [str(d / "no-such.jsonl")]})
    for name, spec in (
        ("train", train),
        ("eval", evals),
        ("unpacked", unpacked),
        ("missing", missing),
    ):
        (d / f"{name}.toml").write_text(spec.to_toml())
    return d, train, evals, model
