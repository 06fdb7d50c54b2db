"""DescribeTokenizer: a spec's model, of any kind, as the server reads it.

A trainer checks its own settings against it (input_client.maxtext: MaxText's pad id, and that
`tokenizer_path` is the same model); the path is checked against the data roots like a stream's.
"""

from __future__ import annotations

from input_client.proto import pb
from input_client.spec import TOKENIZER_KINDS, SpecError, TokenizerSpec
from input_server.data.roots import DataAccess
from input_server.data.tokenizers import load_tokenizer
from input_server.errors import InvalidSpecError

KINDS_REASON = f"must be one of {', '.join(TOKENIZER_KINDS)}"


def describe_tokenizer(request: pb.Tokenizer, access: DataAccess) -> pb.TokenizerInfo:
    """The model's vocabulary size, special ids (-1 where it has none) and the SHA-256 of the
    files its tokens come from (`input_client.model_files.digest`): the `.model`, the tiktoken
    ranks, or a Hugging Face `tokenizer.json` with the config files beside it."""
    kind = request.kind or TokenizerSpec.kind  # the spec's default kind
    if not request.model:
        raise InvalidSpecError(f"`tokenizer.model` is required: the path of a {kind} model.")
    if kind not in TOKENIZER_KINDS:
        raise InvalidSpecError(str(SpecError("tokenizer.kind", kind, KINDS_REASON)))
    spec = TokenizerSpec(model=request.model, kind=kind)
    if "\0" in request.model:
        raise InvalidSpecError("`tokenizer.model` must not contain a NUL character.")
    tokenizer = load_tokenizer(spec, access)
    info = tokenizer.info()
    return pb.TokenizerInfo(
        vocab_size=info.vocab_size,
        bos_id=info.bos_id,
        eos_id=info.eos_id,
        pad_id=info.pad_id,
        unk_id=info.unk_id,
        sha256=tokenizer.digest(),
    )
