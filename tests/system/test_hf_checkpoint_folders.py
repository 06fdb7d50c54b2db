"""Hugging Face checkpoint folders as people have them: MaxText 0.2.5's own Qwen3 folder, whose
tokenizer_config.json names `Qwen2Tokenizer`, gives the ids of transformers'
`AutoTokenizer.from_pretrained(folder, add_bos_token=..., add_eos_token=...)` (MaxText's
`HFTokenizer`) for every flag pair, with the config's EOS `<|im_end|>` and pad, both for the
folder and for its tokenizer.json named alone (the config beside it read too), in process and
streamed by a real server.

The folder ships inside the maxtext wheel, so this runs in MaxText's venv (`-m "not maxtext"`
skips it locally; CI runs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap

import pytest

from input_client import InputClient, PipelineSpec
from input_client.spec import TokenizerSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.trainers import train_hf_tokenizer

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]

TEXTS = [
    "",
    "Hello world<|im_end|> and <|endoftext|> written in a document, <|im_start|>user too",
    "naïve café, 東京 and emoji 🙂 with\ttabs\r\nand newlines   and  spaces ",
    "def f(x):\n    return x ** 2  # it's squared, isn't it? I'll see; we'd 1234567",
]

TRANSFORMERS = textwrap.dedent("""
    import json, os, sys
    from transformers import AutoTokenizer
    import maxtext
    folder = os.path.join(os.path.dirname(maxtext.__file__), "assets/tokenizers/qwen3-tokenizer")
    folder = sys.argv[3] if len(sys.argv) > 3 else folder
    texts = json.load(open(sys.argv[1]))
    result = {"folder": folder}
    for bos in (False, True):
        for eos in (False, True):
            tok = AutoTokenizer.from_pretrained(folder, add_bos_token=bos, add_eos_token=eos)
            result[f"{bos} {eos}"] = {
                "class": type(tok).__name__, "ids": [tok.encode(s) for s in texts],
                "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id,
                "pad_id": tok.pad_token_id, "unk_id": tok.unk_token_id}
    json.dump(result, open(sys.argv[2], "w"))
""")


def _autotokenizer(maxtext_python, texts: list[str], d, *folder: str) -> dict:
    """AutoTokenizer's ids of `texts` for every flag pair (MaxText's Qwen3 folder by default)."""
    (d / "texts.json").write_text(json.dumps(texts))
    out = subprocess.run(
        [maxtext_python, "-c", TRANSFORMERS, str(d / "texts.json"), str(d / "ids.json"), *folder],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((d / "ids.json").read_text())


@pytest.fixture(scope="module")
def reference(maxtext_python, docs, tmp_path_factory) -> tuple[list[str], dict]:
    texts = [*docs[:300], *TEXTS]
    return texts, _autotokenizer(maxtext_python, texts, tmp_path_factory.mktemp("qwen3"))


def _ours(model: str, texts: list[str], bos: bool, eos: bool):
    ours = load_tokenizer(TokenizerSpec(model=model, kind="huggingface", add_bos=bos, add_eos=eos))
    group = ours.encode(texts)
    ends = zip(group.starts, group.lengths, strict=True)
    return ours.info(), [group.tokens[s : s + n].tolist() for s, n in ends]


@pytest.mark.parametrize("named", ["folder", "tokenizer.json"])
def test_maxtexts_qwen3_folder_gives_autotokenizers_ids(reference, named):
    texts, want = reference
    folder = want["folder"]
    model = folder if named == "folder" else os.path.join(folder, "tokenizer.json")
    for flags, theirs in want.items():
        if flags == "folder":
            continue
        assert theirs["class"] == "Qwen2Tokenizer"  # the class the config names, not the file's
        bos, eos = (f == "True" for f in flags.split())
        info, got = _ours(model, texts, bos, eos)
        for i, (a, b) in enumerate(zip(got, theirs["ids"], strict=True)):
            assert a == b, (flags, i, texts[i][:80], a[:20], b[:20])
        assert info.eos_id == theirs["eos_id"] == 151645  # <|im_end|>, the config's EOS
        assert info.pad_id == theirs["pad_id"] == 151643  # <|endoftext|>
        assert info.bos_id == -1 and theirs["bos_id"] is None  # Qwen names no BOS
        assert eos == (got[texts.index("")] == [151645])  # "": EOS alone, or nothing


@pytest.mark.parametrize("eos", [True, False])
def test_a_server_streams_the_qwen3_folder_as_autotokenizer_encodes(
    reference, server, tmp_path, eos
):
    texts, want = reference
    seq = 4096
    folder = tmp_path / "qwen3-tokenizer"  # inside the server's data roots, as a user's copy
    shutil.copytree(want["folder"], folder)
    spec = PipelineSpec(
        source={"paths": [write_jsonl(texts, tmp_path / "texts.jsonl")]},
        tokenizer={"model": str(folder), "kind": "huggingface", "add_bos": True, "add_eos": eos},
        batch={"seq_len": seq, "size": 8, "packing": "none"},
        order={"shuffle": False, "epochs": 1},
        workers={"count": 0},
    )
    with InputClient(server.targets[0]) as c, c.batches(spec) as it:
        rows = [r for b in it for r in b["inputs"]]
    assert len(rows) >= len(texts)
    for i, ids in enumerate(want[f"True {eos}"]["ids"]):
        ids = ids[:seq]
        assert rows[i][: len(ids)].tolist() == ids, (eos, i, texts[i][:80])
        assert not rows[i][len(ids) :].any()


def test_a_llama_class_byte_level_folder_gives_autotokenizers_ids(maxtext_python, docs, tmp_path):
    """DeepSeek's and Llama 3 derivatives' folders name LlamaTokenizerFast over a byte-level
    tokenizer.json, which AutoTokenizer loads as the file stands (TokenizersBackend)."""
    folder = train_hf_tokenizer(docs[:600], tmp_path / "llama", vocab_size=900)
    config_file = tmp_path / "llama" / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizerFast"}))
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    texts = [*docs[600:800], *TEXTS]
    want = _autotokenizer(maxtext_python, texts, tmp_path, folder)
    for flags, theirs in want.items():
        if flags == "folder":
            continue
        assert theirs["class"] == "TokenizersBackend"
        bos, eos = (f == "True" for f in flags.split())
        info, got = _ours(folder, texts, bos, eos)
        for i, (a, b) in enumerate(zip(got, theirs["ids"], strict=True)):
            assert a == b, (flags, i, texts[i][:80], a[:20], b[:20])
        assert (info.bos_id, info.eos_id) == (theirs["bos_id"], theirs["eos_id"])
