"""The spec a MaxText run streams, checked against that run's config before any batch.

Settings live twice, in the spec (what the server makes) and in MaxText's config (what the
model expects); one that differs would train on the wrong shape or the wrong tokens, or fail deep
inside a jitted step. Each mismatch is named with both values. The rules are MaxText 0.2.5's
Grain pre-training pipeline (`grain_data_processing.pretrain_preprocessing_pipeline`,
`data_processing_utils.format_and_batch`); the same checks run on a spec given by hand and on
one derived from the config (`derive`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from input_client import model_files
from input_client.spec import PipelineSpec, ShardSpec


class MaxTextConfigError(ValueError):
    """The spec and MaxText's config disagree, or the config asks for what the adapter lacks."""


def value(config: Any, key: str, default: Any = None) -> Any:
    """`config.key` (`default` where the config lacks it), an enum as its value: MaxText's
    config holds `tokenizer_type` and `dataset_type` as enums."""
    v = getattr(config, key, default)
    return getattr(v, "value", v)


def per_process_batch(config: Any, process_count: int) -> int:
    """MaxText's per-host batch (`data_processing_utils.get_local_batch_size`). Its Grain eval
    pipeline batches with the same size (the eval step then keeps the first
    `global_batch_size_to_eval_on` rows), so this is the eval spec's size too."""
    return int(config.global_batch_size_to_load) // process_count


def tokenizes(config: Any, which: str) -> bool:
    """Whether MaxText tokenizes the `which` ("train" or "eval") data: `tokenize_train_data` /
    `tokenize_eval_data`; false means the column holds token ids, and then MaxText adds no
    BOS/EOS and neither trims nor chunks (`TokenizeAndTrim`/`TokenizeAndChunk` are skipped)."""
    return bool(value(config, f"tokenize_{which}_data", True))


def long_documents(config: Any, *, which: str, packing: str) -> str:
    """What MaxText does with a document longer than `max_target_length`, as the spec's
    `batch.long_documents` policy: `use_truncation` true trims, false chunks. Pre-tokenized
    data skips both: Grain's ConcatThenSplit then runs it on from row to row ("split"),
    PadOrTrimToMaxLength trims it (packing false), and FirstFitPackIterDataset raises
    ValueError ("Inputs to PackedBatch must be truncated to max length"), where the server
    trims it instead."""
    if tokenizes(config, which):
        return "trim" if value(config, "use_truncation", True) else "chunk"
    return "split" if packing == "concat_then_split" else "trim"


def shard_for(spec: PipelineSpec, process_indices: list[int], process_index: int) -> PipelineSpec:
    """The spec with this host's shard: the data-loading process's place among
    `process_indices`, as MaxText's Grain factories shard, unless the spec sets its own."""
    if spec.shard != ShardSpec() or len(process_indices) == 1:
        return spec
    shard = ShardSpec(index=process_indices.index(process_index), count=len(process_indices))
    return dataclasses.replace(spec, shard=shard)


def _differ(
    which: str, spec_key: str, spec_value: Any, config_key: str, config_value: Any
) -> MaxTextConfigError:
    return MaxTextConfigError(
        f"the {which} spec's `{spec_key}` is {spec_value!r} but MaxText's `{config_key}` is "
        f"{config_value!r}; make them agree."
    )


def unsupported(key: str, v: Any, instead: str) -> MaxTextConfigError:
    """The one-line refusal of a MaxText setting the server cannot honour."""
    return MaxTextConfigError(
        f"MaxText's `{key}` {v!r} is not supported by input_client.maxtext; {instead}."
    )


# MaxText settings for another kind of training than pre-training on text; base.yml has them
# false (`is_offline_distillation` is set only by MaxText's distillation trainer).
_OTHER_PIPELINES = {
    "use_sft": "the server makes pre-training batches (MaxText's SFT pipeline masks prompts)",
    "use_dpo": "the server makes pre-training batches (MaxText's DPO pipeline pairs documents)",
    "use_multimodal": "the server makes text batches, without images",
    "is_offline_distillation": "the server's batches carry no teacher logits",
    "colocated_python_data_input": "the server is the data pipeline",
    "grain_use_elastic_iterator": "the server is the data pipeline; its resume state already "
    "survives a change of worker count",
    "elastic_enabled": "the server's per-host batch is fixed "
    "(global_batch_size_to_load / process count)",
}


def check_config(config: Any) -> None:
    """MaxText settings the adapter refuses whatever the spec: each one-line message names the
    key and its value."""
    factor = float(value(config, "expansion_factor_real_data", -1))
    if factor > 1 or 0 < factor < 1:  # MaxText's "off" is any value <= 0, or 1
        raise unsupported(
            "expansion_factor_real_data", config.expansion_factor_real_data, "leave it at -1"
        )
    for key, why in _OTHER_PIPELINES.items():
        if value(config, key, False):
            raise unsupported(key, True, f"{why}; leave it false")
    if not value(config, "packing", True):
        return
    kind = str(value(config, "grain_packing_type", "first_fit"))
    if kind not in ("first_fit", "concat_then_split"):
        raise unsupported(
            "grain_packing_type", kind, "the server packs first_fit or concat_then_split"
        )
    if int(value(config, "max_segments_per_seq", -1) or -1) > 0:
        raise unsupported(
            "max_segments_per_seq",
            config.max_segments_per_seq,
            "the server packs without a cap; leave it at -1",
        )


def check_shape(spec: PipelineSpec, config: Any, *, process_count: int, which: str) -> None:
    """What needs no server: the batch's shape, packing and special tokens against `config`."""
    check_config(config)
    kind = str(value(config, "tokenizer_type", "sentencepiece"))
    if spec.tokenizer.model and spec.tokenizer.kind != kind:
        raise _differ(which, "tokenizer.kind", spec.tokenizer.kind, "tokenizer_type", kind)
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
    tokenized = tokenizes(config, which)
    for key in ("add_bos", "add_eos"):
        given = getattr(spec.tokenizer, key)
        if not tokenized and given:
            raise MaxTextConfigError(
                f"the {which} spec's `tokenizer.{key}` is True but MaxText adds no BOS/EOS to "
                f"pre-tokenized data (`tokenize_{which}_data` is False); make them agree."
            )
        if tokenized and bool(given) != bool(getattr(config, key)):
            raise _differ(which, f"tokenizer.{key}", given, key, getattr(config, key))
    _check_packing(spec, config, which)


_DONE = {"trim": "trimmed", "chunk": "chunked", "split": "split across rows"}


def _check_packing(spec: PipelineSpec, config: Any, which: str) -> None:
    packs = bool(value(config, "packing", True))
    kind = str(value(config, "grain_packing_type", "first_fit"))
    if (spec.batch.packing == "none") == packs:
        raise _differ(which, "batch.packing", spec.batch.packing, "packing", packs)
    if packs and kind != spec.batch.packing:
        raise _differ(which, "batch.packing", spec.batch.packing, "grain_packing_type", kind)
    # MaxText's ConcatThenSplit is built with BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS but no
    # `bos_features`, so Grain replaces nothing: rows start as the server's do.
    want = long_documents(config, which=which, packing=spec.batch.packing)
    policy = spec.batch.long_documents_policy
    if policy != want:
        if tokenizes(config, which):
            why = f"`use_truncation` is {bool(value(config, 'use_truncation', True))}"
        else:
            why = f"`tokenize_{which}_data` is False"
        raise MaxTextConfigError(
            f"the {which} spec's `batch.long_documents` is {policy!r} but with MaxText's {why} "
            f"a document longer than `max_target_length` is {_DONE[want]} "
            f"(`batch.long_documents` {want!r}); make them agree."
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


def tokenizer_file(path: str) -> str:
    """The file of `tokenizer_path` the tokens come from: the path itself, or for a folder (a
    Hugging Face tokenizer) the `tokenizer.json` inside it."""
    return os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path


def tokenizer_digest(path: str, kind: str) -> str:
    """What the server's DescribeTokenizer reports as `sha256` for the same model here
    (`input_client.model_files`: a Hugging Face model's config files count too)."""
    if kind == "huggingface":
        return model_files.digest(model_files.hf_files(path))
    return model_files.digest({"": path})


def check_tokenizer(spec: PipelineSpec, config: Any, tokenizer: Any, *, which: str) -> None:
    """The server's description of the spec's model (`DescribeTokenizer`) against `config`:
    its pieces fit `vocab_size`, and `tokenizer_path` is the same file (for a folder, the same
    `tokenizer.json`)."""
    if tokenizer.vocab_size > int(config.vocab_size):
        raise _differ(
            which,
            "tokenizer.model",
            f"{spec.tokenizer.model} ({tokenizer.vocab_size} pieces)",
            "vocab_size",
            config.vocab_size,
        )
    path = str(getattr(config, "tokenizer_path", "") or "")
    local = tokenizer_file(path) if path else ""
    if not os.path.isfile(local):
        what = "a folder without a tokenizer.json" if os.path.isdir(path) else "not a file"
        raise MaxTextConfigError(
            f"MaxText's `tokenizer_path` {path!r} is {what} here, so it cannot be checked "
            f"against the {which} spec's `tokenizer.model` {spec.tokenizer.model!r}; set it to a "
            f"local copy of that model."
        )
    if tokenizer_digest(path, spec.tokenizer.kind) != tokenizer.sha256:
        what = (
            "another model: its tokenizer.json, tokenizer_config.json or special_tokens_map.json"
            " differs"
            if spec.tokenizer.kind == "huggingface"
            else "another file: its SHA-256 differs"
        )
        raise _differ(
            which, "tokenizer.model", spec.tokenizer.model, "tokenizer_path", f"{path} ({what})"
        )


def maxtext_pad_id(tokenizer: Any, kind: str) -> int:
    """The pad id MaxText takes from its tokenizer (`get_tokenizer_and_pad_id`: the pad id if
    not None, else the unk id if not None, else 0), from the server's `TokenizerInfo` (-1 where
    the model has none). sentencepiece's `pad_id()` and MaxText's tiktoken `pad_id` are -1, not
    None, for a model without one, so -1 stays; only Hugging Face's `pad_token_id` is None."""
    if kind != "huggingface":
        return int(tokenizer.pad_id)
    for candidate in (tokenizer.pad_id, tokenizer.unk_id):
        if candidate >= 0:
            return int(candidate)
    return 0


def check_against_config(
    spec: PipelineSpec, config: Any, tokenizer: Any, *, process_count: int, which: str
) -> None:
    """Raises MaxTextConfigError naming the first setting where `spec` and `config` differ.

    `tokenizer` is the server's `DescribeTokenizer` answer for the spec's model; `which` says
    which spec ("train" or "eval") for the message.
    """
    check_shape(spec, config, process_count=process_count, which=which)
    check_tokenizer(spec, config, tokenizer, which=which)
