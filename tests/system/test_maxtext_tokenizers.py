"""Every tokenizer kind gives the ids MaxText's own class of that kind gives (MaxText 0.2.5 in
its Python 3.12 venv: `SentencePieceTokenizer`, `HFTokenizer` through transformers,
`TikTokenTokenizer`), on the real corpus plus the texts where the kinds differ most: special
tokens written in the text, long runs that MaxText splits before tiktoken, and empty documents.
Also their special ids and pad id, as `get_tokenizer_and_pad_id` takes them.

Skip locally with `-m "not maxtext"`; CI runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from input_client.spec import TokenizerSpec
from input_server.data.tokenizers import load_tokenizer
from input_server.data.tokenizers.trainers import (
    train_hf_tokenizer,
    train_sentencepiece,
    write_tiktoken_model,
)

pytestmark = [pytest.mark.maxtext, pytest.mark.timeout(1200)]

HARD = [
    "",
    "<|bos|> and <|eos|> written in a document, <|begin_of_text|> too",
    "the" * 10_000 + " then words " + " " * 26_000 + "end",  # runs MaxText splits at 25,000
    ("word " * 90_000).strip(),  # past the 400,000 characters MaxText feeds tiktoken at once
    "naïve café, 東京 and emoji 🙂 with\ttabs\r\nand newlines",
]

MAXTEXT = textwrap.dedent("""
    import json, sys
    from maxtext.input_pipeline import tokenizer as t
    from maxtext.input_pipeline.data_processing_utils import get_tokenizer_and_pad_id
    kind, path, texts_file, out = sys.argv[1:5]
    texts = json.load(open(texts_file))
    result = {}
    for bos in (False, True):
        for eos in (False, True):
            config = type("C", (), dict(tokenizer_path=path, tokenizer_type=kind, add_bos=bos,
                                        add_eos=eos, hf_access_token=None))
            tok, pad_id = get_tokenizer_and_pad_id(config)
            result[f"{bos} {eos}"] = {
                "ids": [tok.encode(s) for s in texts], "pad_id": pad_id,
                "bos_id": tok.bos_id, "eos_id": tok.eos_id}
    json.dump(result, open(out, "w"))
""")


def _models(docs, d) -> dict[str, str]:
    return {
        "sentencepiece": train_sentencepiece(docs, d / "spm", vocab_size=1000, with_pad=False),
        "huggingface": train_hf_tokenizer(docs, d / "hf", vocab_size=1000, with_pad=False),
        # MaxText asserts that a tiktoken path says "tiktoken".
        "tiktoken": write_tiktoken_model(docs, d / "bpe.tiktoken", vocab_size=1000),
    }


@pytest.mark.parametrize("kind", ["sentencepiece", "huggingface", "tiktoken"])
def test_ids_equal_maxtexts_own_tokenizer(maxtext_python, docs, tmp_path, kind):
    path = _models(docs[:800], tmp_path)[kind]
    texts = [*docs[:600], *HARD]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    out = subprocess.run(
        [
            maxtext_python,
            "-c",
            MAXTEXT,
            kind,
            path,
            str(tmp_path / "texts.json"),
            str(tmp_path / "ids.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        # tiktoken caches a local ranks file by its path; an empty cache dir turns that off.
        env={
            **os.environ,
            "DECOUPLE_GCLOUD": "TRUE",
            "JAX_PLATFORMS": "cpu",
            "TIKTOKEN_CACHE_DIR": "",
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    want = json.loads((tmp_path / "ids.json").read_text())
    for flags, theirs in want.items():
        bos, eos = (f == "True" for f in flags.split())
        ours = load_tokenizer(TokenizerSpec(model=path, kind=kind, add_bos=bos, add_eos=eos))
        group = ours.encode(texts)
        got = [
            group.tokens[s : s + n].tolist()
            for s, n in zip(group.starts, group.lengths, strict=True)
        ]
        for i, (a, b) in enumerate(zip(got, theirs["ids"], strict=True)):
            assert a == b, (flags, i, texts[i][:80], a[:20], b[:20])
        info = ours.info()
        assert (info.bos_id, info.eos_id) == (theirs["bos_id"], theirs["eos_id"])
        # MaxText's pad: the tokenizer's pad id, else its unk id, else 0.
        pad = (
            info.pad_id
            if kind != "huggingface"
            else (info.pad_id if info.pad_id >= 0 else info.unk_id if info.unk_id >= 0 else 0)
        )
        assert pad == theirs["pad_id"], (kind, info)
