"""The spec a MaxText run streams, checked against that run's config before any batch.

Settings live twice, in the spec (what the server makes) and in MaxText's config (what the
model expects); one that differs would train on the wrong shape or the wrong tokens, or fail deep
inside a jitted step. Each mismatch is named with both values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

from input_client.spec import PipelineSpec, ShardSpec


class MaxTextConfigError(ValueError):
    """The spec and MaxText's config disagree, or the config asks for what the adapter lacks."""


def per_process_batch(config: Any, process_count: int) -> int:
    """MaxText's per-host batch (`data_processing_utils.get_local_batch_size`)."""
    return int(config.global_batch_size_to_load) // process_count


def shard_for(spec: PipelineSpec, process_indices: list[int], process_index: int) -> PipelineSpec:
    """The spec with this host's shard: the data-loading process's place among
    `process_indices`, as MaxText's Grain factories shard, unless the spec sets its own."""
    if spec.shard != ShardSpec() or len(process_indices) == 1:
        return spec
    shard = ShardSpec(index=process_indices.index(process_index), count=len(process_indices))
    return dataclasses.replace(spec, shard=shard)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _differ(
    which: str, spec_key: str, spec_value: Any, config_key: str, config_value: Any
) -> MaxTextConfigError:
    return MaxTextConfigError(
        f"the {which} spec's `{spec_key}` is {spec_value!r} but MaxText's `{config_key}` is "
        f"{config_value!r}; make them agree."
    )


def _unsupported(key: str, value: Any, instead: str) -> MaxTextConfigError:
    return MaxTextConfigError(
        f"MaxText's `{key}` {value!r} is not supported by input_client.maxtext; {instead}."
    )


def check_shape(spec: PipelineSpec, config: Any, *, process_count: int, which: str) -> None:
    """What needs no server: the batch's shape, packing and special tokens against `config`."""
    factor = float(getattr(config, "expansion_factor_real_data", -1))
    if factor > 1 or 0 < factor < 1:  # MaxText's "off" is any value <= 0, or 1
        raise _unsupported(
            "expansion_factor_real_data", config.expansion_factor_real_data, "leave it at -1"
        )
    for key in ("colocated_python_data_input", "grain_use_elastic_iterator"):
        if getattr(config, key, False):
            raise _unsupported(key, True, "the server is the data pipeline; leave it false")
    kind = getattr(config, "tokenizer_type", "sentencepiece")
    kind = getattr(kind, "value", kind)  # an enum in MaxText's config
    if kind != "sentencepiece" and spec.tokenizer.model:
        raise _differ(which, "tokenizer.model", "(a sentencepiece model)", "tokenizer_type", kind)
    if spec.batch.seq_len != int(config.max_target_length):
        raise _differ(
            which,
            "batch.seq_len",
            spec.batch.seq_len,
            "max_target_length",
            config.max_target_length,
        )
    rows = per_process_batch(config, process_count)
    if spec.batch.size != rows:
        raise _differ(
            which,
            "batch.size",
            spec.batch.size,
            f"global_batch_size_to_load // process count "
            f"({config.global_batch_size_to_load} // {process_count})",
            rows,
        )
    for key in ("add_bos", "add_eos"):
        if bool(getattr(spec.tokenizer, key)) != bool(getattr(config, key)):
            raise _differ(
                which, f"tokenizer.{key}", getattr(spec.tokenizer, key), key, getattr(config, key)
            )
    _check_packing(spec, config, which)


def _check_packing(spec: PipelineSpec, config: Any, which: str) -> None:
    packs = bool(getattr(config, "packing", True))
    kind = str(getattr(config, "grain_packing_type", "first_fit"))
    if (spec.batch.packing == "none") == packs:
        raise _differ(which, "batch.packing", spec.batch.packing, "packing", packs)
    if packs and kind != spec.batch.packing:
        raise _differ(which, "batch.packing", spec.batch.packing, "grain_packing_type", kind)
    if packs and spec.batch.packing != "first_fit":
        # MaxText's ConcatThenSplit starts every row with BOS; the server's rows do not.
        raise _unsupported("grain_packing_type", kind, "use first_fit, or packing=false")
    if packs and int(getattr(config, "max_segments_per_seq", -1)) > 0:
        raise _unsupported(
            "max_segments_per_seq",
            config.max_segments_per_seq,
            "the server packs without a cap; leave it at -1",
        )
    if not bool(getattr(config, "use_truncation", True)):
        raise _unsupported(
            "use_truncation", False, "the server trims long documents to seq_len; leave it true"
        )


def check_vocab_size(spec: PipelineSpec, config: Any, *, which: str) -> None:
    """A spec without a model: its `tokenizer.vocab_size` fits MaxText's `vocab_size`."""
    if spec.tokenizer.vocab_size > int(config.vocab_size):
        raise _differ(
            which,
            "tokenizer.vocab_size",
            spec.tokenizer.vocab_size,
            "vocab_size",
            config.vocab_size,
        )


def check_tokenizer(spec: PipelineSpec, config: Any, tokenizer: Any, *, which: str) -> None:
    """The server's description of the spec's model (`DescribeTokenizer`) against `config`:
    its pieces fit `vocab_size`, and `tokenizer_path` is the same file."""
    if tokenizer.vocab_size > int(config.vocab_size):
        raise _differ(
            which,
            "tokenizer.model",
            f"{spec.tokenizer.model} ({tokenizer.vocab_size} pieces)",
            "vocab_size",
            config.vocab_size,
        )
    path = str(getattr(config, "tokenizer_path", "") or "")
    if not os.path.isfile(path):
        raise MaxTextConfigError(
            f"MaxText's `tokenizer_path` {path!r} is not a file here, so it cannot be checked "
            f"against the {which} spec's `tokenizer.model` {spec.tokenizer.model!r}; set it to a "
            f"local copy of that model."
        )
    if _sha256(path) != tokenizer.sha256:
        raise _differ(
            which,
            "tokenizer.model",
            spec.tokenizer.model,
            "tokenizer_path",
            f"{path} (another file: its SHA-256 differs)",
        )


def check_against_config(
    spec: PipelineSpec, config: Any, tokenizer: Any, *, process_count: int, which: str
) -> None:
    """Raises MaxTextConfigError naming the first setting where `spec` and `config` differ.

    `tokenizer` is the server's `DescribeTokenizer` answer for the spec's model; `which` says
    which spec ("train" or "eval") for the message.
    """
    check_shape(spec, config, process_count=process_count, which=which)
    check_tokenizer(spec, config, tokenizer, which=which)
