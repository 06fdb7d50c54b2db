"""A MaxText run's train and eval specs, derived from its own config as its Grain pipeline reads it.

The rules follow MaxText 0.2.5's `grain_data_processing` (`make_grain_train_iterator`,
`make_grain_eval_iterator`, `get_datasets`, `find_data_files`, `pretrain_preprocessing_pipeline`)
and `data_processing_utils`. What the server cannot make as MaxText would is refused with one
line naming the MaxText key and its value (`MaxTextConfigError`), never served differently.
Pure but for the file system MaxText itself reads: patterns resolve against the working folder
and the mixture config file is read; nothing is globbed and no server is asked.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from input_client.maxtext.check import (
    MaxTextConfigError,
    check_config,
    long_documents,
    per_process_batch,
    tokenizes,
    unsupported,
    value,
)
from input_client.spec import BatchSpec, PipelineSpec, SpecError

# The `tokenizer.kind`s MaxText names as its `tokenizer_type` (the server's "tekken" is not one:
# MaxText has no tokenizer class for it).
MAXTEXT_TOKENIZER_TYPES = ("sentencepiece", "huggingface", "tiktoken")
# MaxText's `grain_file_type` -> the server's source format. MaxText's ArrayRecord records are
# serialized tf.train.Example protos (`input_pipeline_utils.ParseFeatures`).
FILE_TYPES = {
    "arrayrecord": {"format": "arrayrecord", "record_format": "tf_example"},
    "parquet": {"format": "parquet"},
    "tfrecord": {"format": "tfrecord"},
}
# The format a file name says, by the names MaxText's, TFDS's (`x-train.tfrecord-00000-of-00008`)
# and the server's files take; a pattern's trailing `*` is part of the name.
_NAMED = (
    (re.compile(r"\.(jsonl|ndjson)(\.(gz|zst))?\*?$"), "jsonl", "JSON lines"),
    (re.compile(r"\.json(\.(gz|zst))?\*?$"), "jsonl", "JSON"),
    (re.compile(r"\.txt(\.(gz|zst))?\*?$"), "text", "plain-text"),
    (re.compile(r"\.parquet\*?$"), "parquet", "Parquet"),
    (re.compile(r"\.tfrecords?(-[^/]*|\*)?$"), "tfrecord", "TFRecord"),
    (re.compile(r"\.array_?records?(-[^/]*|\*)?$"), "arrayrecord", "ArrayRecord"),
)
LOCAL_ONLY = (
    "is not a local path: the server reads files inside its data roots; mount the storage "
    "(e.g. gcsfuse) and name the local path"
)


def train_spec(config: Any, *, process_count: int) -> PipelineSpec:
    """The spec of MaxText's Grain train pipeline for `config` (MaxText's config object, with
    base.yml's defaults), on one of `process_count` data-loading processes.

    Raises:
      MaxTextConfigError: naming the MaxText key and value the server cannot honour.
    """
    return _spec(config, which="train", process_count=process_count)


def eval_spec(config: Any, *, process_count: int) -> PipelineSpec:
    """The spec of MaxText's Grain eval pipeline: `grain_eval_files`, unshuffled, one pass.

    Raises:
      MaxTextConfigError: naming the MaxText key and value the server cannot honour.
    """
    return _spec(config, which="eval", process_count=process_count)


def _spec(config: Any, *, which: str, process_count: int) -> PipelineSpec:
    check_config(config)
    file_type = str(value(config, "grain_file_type"))
    if file_type not in FILE_TYPES:
        raise unsupported(
            "grain_file_type", file_type, f"the server reads {', '.join(FILE_TYPES)} files"
        )
    columns_key = f"{which}_data_columns"
    columns = list(value(config, columns_key))
    if len(columns) != 1:
        raise unsupported(
            columns_key, columns, "MaxText's pre-training pipeline reads one column (it asserts it)"
        )
    tokenized = tokenizes(config, which)
    field = {"text_field" if tokenized else "token_field": str(columns[0])}
    components, origin = _components(config, which=which, file_type=file_type)
    for _, pattern, _ in components:
        check_file_names(origin, pattern, file_type)
    sources = [
        {
            "paths": [_local(pattern, origin)],
            **FILE_TYPES[file_type],
            **field,
            **({"name": name, "weight": weight} if len(components) > 1 else {}),
        }
        for name, pattern, weight in components
    ]
    packing = str(value(config, "grain_packing_type")) if value(config, "packing") else "none"
    policy = long_documents(config, which=which, packing=packing)
    # Written only where it is not the packing's default, so that a derived spec is the spec
    # one would write by hand (same fingerprint, same resume states).
    default = BatchSpec(packing=packing).long_documents_policy
    batch = {
        "seq_len": int(config.max_target_length),
        "size": per_process_batch(config, process_count),
        "packing": packing,
        "long_documents": "" if policy == default else policy,
    }
    tables = {
        "source": sources if len(sources) > 1 else sources[0],
        "tokenizer": _tokenizer(config, tokenized),
        "batch": batch,
        "order": _order(config, which),
    }
    try:
        return PipelineSpec.from_dict(tables)
    except SpecError as e:  # a value MaxText took but the server's spec cannot hold
        key = _ORIGINS.get(e.key.split(".")[-1], origin)
        key = columns_key if e.key.endswith("_field") else key
        raise MaxTextConfigError(
            f"MaxText's `{key}` gives a spec the server refuses: {e}"
        ) from None


# Which MaxText key each spec key comes from, for a value the spec refuses.
_ORIGINS = {
    "seq_len": "max_target_length",
    "size": "global_batch_size_to_load",
    "seed": "data_shuffle_seed",
    "epochs": "num_epoch",
    "model": "tokenizer_path",
    "kind": "tokenizer_type",
}


def named_format(pattern: str) -> tuple[str, str] | None:
    """(format, what) the file names of `pattern` say by their extension, or None."""
    name = pattern.rsplit("/", 1)[-1].lower()
    return next(((f, what) for regex, f, what in _NAMED if regex.search(name)), None)


def check_file_names(key: str, pattern: str, file_type: str | None) -> None:
    """Refuses a pattern whose file names say files that `grain_file_type` (None where not
    known) cannot read: read as the wrong format, they would fail as `DATA_LOSS` only at the
    first batch, after MaxText's whole set-up.

    Raises:
      MaxTextConfigError: naming the key, the pattern and the way out.
    """
    named = named_format(pattern)
    if named is None:
        return
    found, what = named
    if found in ("jsonl", "text"):  # no grain_file_type of MaxText's reads them
        raise MaxTextConfigError(
            f"MaxText's `{key}` {pattern!r} names {what} files, which no grain_file_type of "
            f"MaxText's reads (arrayrecord, parquet, tfrecord); give the launcher --spec "
            f"SPEC.toml whose [source] names them (README, 'Bring your own data'), or convert "
            f"them to Parquet (grain_file_type=parquet) or ArrayRecord."
        )
    if file_type is not None and found != file_type:
        raise MaxTextConfigError(
            f"MaxText's `{key}` {pattern!r} names {what} files but grain_file_type is "
            f"{file_type!r} (arrayrecord when not given); add grain_file_type={found}."
        )


def _order(config: Any, which: str) -> dict[str, Any]:
    seed = int(config.data_shuffle_seed)
    if which == "eval":  # make_grain_eval_iterator: shuffle=False, num_epoch=1
        return {"seed": seed, "shuffle": False, "epochs": 1}
    epochs = int(config.num_epoch)
    if epochs < 1:
        raise unsupported(
            "num_epoch",
            epochs,
            "MaxText's Grain pipeline repeats the data `num_epoch` times and Grain's repeat "
            "refuses 0 and below; give a count of 1 or more (or a --spec with order.epochs = 0 "
            "to repeat forever)",
        )
    return {"seed": seed, "shuffle": bool(config.enable_data_shuffling), "epochs": epochs}


def _tokenizer(config: Any, tokenized: bool) -> dict[str, Any]:
    kind = str(value(config, "tokenizer_type"))
    if kind not in MAXTEXT_TOKENIZER_TYPES:
        loads = ", ".join(MAXTEXT_TOKENIZER_TYPES)
        raise unsupported("tokenizer_type", kind, f"the server loads {loads}")
    path = str(value(config, "tokenizer_path") or "")
    if not path:
        # MaxText builds its tokenizer from it for the pad id even for pre-tokenized data.
        raise MaxTextConfigError(
            "MaxText's `tokenizer_path` is empty; name the tokenizer's file (or, for "
            "tokenizer_type=huggingface, its folder)."
        )
    if "://" in path:
        raise unsupported("tokenizer_path", path, LOCAL_ONLY)
    if kind == "huggingface" and not os.path.exists(path):
        raise unsupported(
            "tokenizer_path",
            path,
            "it is not a local folder (a Hugging Face hub name?): the server loads a "
            "tokenizer.json from its data roots; save the tokenizer (save_pretrained) and name "
            "that folder",
        )
    # With pre-tokenized data MaxText adds nothing: TokenizeAndTrim/TokenizeAndChunk, where
    # its tokenizer adds BOS/EOS, are skipped.
    return {
        "model": os.path.abspath(path),
        "kind": kind,
        "add_bos": bool(config.add_bos) and tokenized,
        "add_eos": bool(config.add_eos) and tokenized,
    }


def _components(config: Any, *, which: str, file_type: str) -> tuple[list[tuple], str]:
    """[(name, pattern, weight)] of the data MaxText reads, and the key they come from."""
    key = f"grain_{which}_files"
    files = str(value(config, key) or "")
    mixture = (
        str(value(config, "grain_train_mixture_config_path") or "") if which == "train" else ""
    )
    if mixture:
        if file_type != "arrayrecord":
            raise unsupported(
                "grain_train_mixture_config_path",
                mixture,
                f"MaxText reads it only with grain_file_type=arrayrecord, not {file_type!r} "
                f"(it would read grain_train_files); remove it",
            )
        return _mixture_config(mixture), "grain_train_mixture_config_path"
    if not files:
        files, key = _constructed(config, which=which, file_type=file_type)
    if ";" not in files:
        return [("", files, 1.0)], key
    if file_type != "arrayrecord":
        raise unsupported(
            key,
            files,
            f"MaxText mixes ';' patterns only with grain_file_type=arrayrecord, not {file_type!r}",
        )
    parts = [p.split(",") for p in files.split(";")]
    if any(len(p) != 2 or not p[0] for p in parts):
        raise unsupported(key, files, "a mixture is 'PATTERN,WEIGHT;PATTERN,WEIGHT;...'")
    try:
        weights = [float(w) for _, w in parts]
    except ValueError:
        raise unsupported(key, files, "a mixture's weights must be numbers") from None
    _positive(key, files, weights)
    # MaxText's own normalisation (get_datasets), then Grain's, below. Named by position: Grain
    # checkpoints a list mixture's components by position, so a resume survives new weights.
    total = sum(weights)
    rounded = [round(w / total, 4) for w in weights]
    _positive(key, files, rounded)
    return [
        (str(i), pattern, w)
        for i, ((pattern, _), w) in enumerate(zip(parts, grain_proportions(rounded), strict=True))
    ], key


def _mixture_config(path: str) -> list[tuple]:
    """MaxText's `grain_train_mixture_config_path`: {name: {"path": ..., "weight": ...}}, its
    keys the components' names (Grain checkpoints a dict mixture's components by key)."""
    key = "grain_train_mixture_config_path"
    try:
        with open(path, encoding="utf-8") as f:
            mixture = json.load(f)
    except (OSError, ValueError) as e:
        raise unsupported(key, path, f"cannot be read as JSON ({e})") from None
    if not isinstance(mixture, dict) or not mixture:
        raise unsupported(key, path, 'must hold {"NAME": {"path": ..., "weight": ...}, ...}')
    names, patterns, weights = [], [], []
    for name, entry in mixture.items():
        try:
            patterns.append(str(entry["path"]))
            weights.append(float(entry["weight"]))
        except (TypeError, KeyError, ValueError):
            raise unsupported(
                key, path, f'its {name!r} must be {{"path": PATTERN, "weight": NUMBER}}'
            ) from None
        names.append(str(name))
    _positive(key, path, weights)
    total = sum(weights)
    proportions = grain_proportions([w / total for w in weights])
    return list(zip(names, patterns, proportions, strict=True))


def grain_proportions(weights: list[float]) -> list[int]:
    """The integer proportions Grain's `IterDataset.mix` draws documents by for `weights`
    (grain `mix._float_to_int_proportions`: scaled so the smallest is 100, then truncated), so
    the server's mixture keeps MaxText's own shares: 0.3 : 0.7 is 100 : 233."""
    scale = 100 / min(weights)
    return [int(w * scale) for w in weights]


def _positive(key: str, shown: str, weights: list[float]) -> None:
    if any(not w > 0 for w in weights):  # Grain's mix: "Must specify all non-zero proportions"
        raise unsupported(key, shown, f"every mixture weight must be above 0, got {weights}")


def _constructed(config: Any, *, which: str, file_type: str) -> tuple[str, str]:
    """The files MaxText names for an empty `grain_{which}_files`: a Hugging Face hub dataset
    from `hf_path` (parquet; refused), or TFDS's prepared layout under `dataset_path`
    (tfrecord; `construct_tfds_tfrecord_path`)."""
    hf_path = str(value(config, "hf_path") or "")
    if file_type == "parquet" and hf_path:
        raise unsupported(
            "hf_path",
            hf_path,
            f"with an empty grain_{which}_files MaxText reads that Hugging Face hub dataset "
            f"(hf://); the server reads local files: download it and name them in "
            f"grain_{which}_files",
        )
    dataset_path = str(value(config, "dataset_path") or "")
    name = str(value(config, "dataset_name" if which == "train" else "eval_dataset_name") or "")
    split = str(value(config, f"{which}_split") or "")
    if file_type == "tfrecord" and dataset_path and name and split:
        if "://" in dataset_path:
            raise unsupported("dataset_path", dataset_path, LOCAL_ONLY)
        folder = name.strip().strip("/").replace(":", "/")
        return f"{dataset_path.strip().rstrip('/')}/{folder}/*-{split}.tfrecord-*", "dataset_path"
    if which == "train":
        raise MaxTextConfigError(
            "MaxText's `grain_train_files` is empty and no `grain_train_mixture_config_path` is "
            "given; name the training files (a glob, or MaxText's 'a*,0.3;b*,0.7' mixture), or "
            "give the launcher --spec."
        )
    raise MaxTextConfigError(
        "MaxText's `grain_eval_files` is empty but eval_interval > 0 asks for eval batches and "
        "no eval spec was given; name the eval files, or give the launcher --eval-spec."
    )


def _local(pattern: str, key: str) -> str:
    """A pattern as MaxText's `find_data_files` globs it (`Path(p).expanduser().resolve()`):
    absolute, since the server would resolve a relative one against its own data root. MaxText
    globs without `recursive=True`, where `**` is one folder level, as `*` is; the server's
    `**` is any depth, so each `**` part becomes `*`."""
    if "://" in pattern:  # gs:// and hf:// are remote in MaxText; nothing else is a URL there
        raise unsupported(key, pattern, LOCAL_ONLY)
    resolved = Path(pattern).expanduser().resolve()
    return str(Path(*("*" if part == "**" else part for part in resolved.parts)))
