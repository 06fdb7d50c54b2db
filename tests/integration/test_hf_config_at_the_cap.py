"""A Hugging Face folder whose tokenizer_config.json is near MAX_CONFIG_BYTES with 118,000
distinct special tokens, written as transformers 4's `save_pretrained` writes them (each in
`added_tokens_decoder` and `additional_special_tokens`, the list again in
special_tokens_map.json): the real loader takes it within a deadline, in a child process so the
deadline stops it; the lists the configs name are read in the order they always were.

The two lists were compared as lists, quadratic (issue 50; before and after in
docs/benchmarks.md, "Tokenizer configs near their cap").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from input_server.data.tokenizers.hf_config import named_tokens
from input_server.data.tokenizers.huggingface import MAX_CONFIG_BYTES
from input_server.testing.tokenizer_models import train_qwen2_bpe, write_hf_folder
from tests.support import ROOT

# Short distinct names, so that as many as may be fit under the cap.
SPECIALS = [f"<r{i}>" for i in range(118_000)]
# Generous for the child's start and the linear load on a busy host, and well under what the
# quadratic check took on the same host (the module docstring's figures).
LOAD_S = 20
LOAD = """
import json, sys
from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import load_tokenizer
spec = TokenizerSpec(model=sys.argv[1], kind="huggingface", add_eos=True, backend="reference")
tokenizer = load_tokenizer(spec)
info = tokenizer.info()
group = tokenizer.encode([sys.argv[2]], 0)
ids = group.tokens[group.starts[0] : group.starts[0] + group.lengths[0]].tolist()
print(json.dumps({"vocab_size": info.vocab_size, "eos_id": info.eos_id, "ids": ids}))
"""


@pytest.fixture(scope="module")
def trained(docs) -> Tokenizer:
    tok = train_qwen2_bpe(docs[:600])
    tok.add_special_tokens(SPECIALS)
    return tok


@pytest.fixture(scope="module")
def at_the_cap(trained, tmp_path_factory) -> str:
    folder = write_hf_folder(
        tmp_path_factory.mktemp("hf-cap") / "model",
        trained,
        tokenizer_class="Qwen2Tokenizer",
        eos_token="<|im_end|>",
        additional_special_tokens=SPECIALS,
    )
    mapped = {"eos_token": "<|im_end|>", "additional_special_tokens": SPECIALS}
    with open(os.path.join(folder, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(mapped, f)
    return folder


def test_a_config_near_the_cap_with_many_special_tokens_loads_within_a_deadline(
    trained, at_the_cap
):
    size = os.path.getsize(os.path.join(at_the_cap, "tokenizer_config.json"))
    assert MAX_CONFIG_BYTES - (1 << 20) < size <= MAX_CONFIG_BYTES, size  # within a MB of it
    text = f"a {SPECIALS[0]} b {SPECIALS[-1]} c"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", LOAD, at_the_cap, text],
            capture_output=True,
            text=True,
            timeout=LOAD_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading a {size}-byte tokenizer_config.json took over {LOAD_S} s")
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    eos = trained.token_to_id("<|im_end|>")
    assert got["vocab_size"] == trained.get_vocab_size(with_added_tokens=True)
    assert got["eos_id"] == eos
    # The named specials are the file's ids, found in the text, the EOS after them.
    assert got["ids"] == [*trained.encode(text, add_special_tokens=False).ids, eos]
    assert trained.token_to_id(SPECIALS[-1]) in got["ids"]


def test_extra_special_tokens_keep_their_order_and_an_earlier_lists_token_is_left_out(
    trained,
):
    config = {
        "additional_special_tokens": ["<r1>", {"content": "<r2>"}, "", None],
        "extra_special_tokens": {"image": "<r3>", "again": "<r1>"},
    }
    mapped = {"additional_special_tokens": ["<r2>", "<r4>"], "extra_special_tokens": None}
    named, extra = named_tokens(config, mapped, trained)
    assert extra == ["<r1>", "<r2>", "<r3>", "<r4>"]
    assert named == dict.fromkeys(("bos_token", "eos_token", "unk_token", "pad_token"))
