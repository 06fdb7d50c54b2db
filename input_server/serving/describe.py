"""DescribeTokenizer: a spec's sentencepiece model as the server reads it.

A trainer checks its own settings against it (input_client.maxtext: MaxText's pad id, and that
`tokenizer_path` is the same model); the path is checked against the data roots like a stream's.
"""

from __future__ import annotations

import hashlib

from input_client.proto import pb
from input_client.spec import TokenizerSpec
from input_server.data.roots import DataAccess
from input_server.data.tokenizer import Tokenizer
from input_server.errors import InvalidSpecError


def describe_tokenizer(request: pb.Tokenizer, access: DataAccess) -> pb.TokenizerInfo:
    if not request.model:
        raise InvalidSpecError("`tokenizer.model` is required: the path of a sentencepiece model.")
    if "\0" in request.model:
        raise InvalidSpecError("`tokenizer.model` must not contain a NUL character.")
    model = access.file(request.model, "tokenizer.model")
    sp = Tokenizer(TokenizerSpec(model=model), written=request.model).processor()
    with open(model, "rb") as f:
        digest = hashlib.file_digest(f, "sha256")
    return pb.TokenizerInfo(
        vocab_size=sp.vocab_size(),
        bos_id=sp.bos_id(),
        eos_id=sp.eos_id(),
        pad_id=sp.pad_id(),
        unk_id=sp.unk_id(),
        sha256=digest.hexdigest(),
    )
