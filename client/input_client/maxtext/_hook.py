"""Where MaxText looks up its input pipeline, found or refused with a message naming the version.

MaxText 0.2.5's `input_pipeline_interface.create_data_iterator` reads
`make_grain_train_iterator` and `make_grain_eval_iterator` from its module's globals each time
it runs, so setting those two names swaps the pipeline and leaves the rest of MaxText as it is.
A MaxText that moved them fails here, before training starts, not mid-run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType

TESTED_VERSIONS = ("0.2.5",)
FACTORIES = ("make_grain_train_iterator", "make_grain_eval_iterator")


class MaxTextHookError(RuntimeError):
    """MaxText is missing, or does not look its factories up where this adapter sets them."""


def maxtext_version() -> str:
    try:
        return importlib.metadata.version("maxtext")
    except importlib.metadata.PackageNotFoundError:
        raise MaxTextHookError(
            "MaxText is not installed in this environment (pip install "
            f"maxtext=={TESTED_VERSIONS[-1]})."
        ) from None


def _import(name: str, version: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise MaxTextHookError(
            f"MaxText {version} has no {name} ({e}); input_client.maxtext was tested with "
            f"MaxText {', '.join(TESTED_VERSIONS)}."
        ) from None


def interface_module() -> ModuleType:
    """`maxtext.input_pipeline.input_pipeline_interface`, checked to read FACTORIES at call time."""
    version = maxtext_version()
    module = _import("maxtext.input_pipeline.input_pipeline_interface", version)
    create = getattr(module, "create_data_iterator", None)
    reads = set(getattr(getattr(create, "__code__", None), "co_names", ()))
    missing = [n for n in FACTORIES if not hasattr(module, n) or n not in reads]
    if create is None or missing:
        raise MaxTextHookError(
            f"MaxText {version}'s input_pipeline_interface.create_data_iterator no longer looks "
            f"up {', '.join(missing or FACTORIES)} where input_client.maxtext replaces it; the "
            f"adapter was tested with MaxText {', '.join(TESTED_VERSIONS)}."
        )
    return module


def _module_with(name: str, attribute: str) -> ModuleType:
    """MaxText's module `name`, refused by MaxText's version unless it has `attribute`."""
    version = maxtext_version()
    module = _import(name, version)
    if not hasattr(module, attribute):
        raise MaxTextHookError(
            f"MaxText {version}'s {name} has no {attribute}; "
            f"input_client.maxtext was tested with MaxText "
            f"{', '.join(TESTED_VERSIONS)}."
        )
    return module


def multihost_dataloading() -> ModuleType:
    """MaxText's own global-batch assembly (`MultiHostDataLoadIterator`)."""
    return _module_with("maxtext.input_pipeline.multihost_dataloading", "MultiHostDataLoadIterator")


def metric_logger() -> ModuleType:
    """MaxText's per-step metrics writer (`MetricLogger`: log, TensorBoard, metrics file)."""
    module = _module_with("maxtext.common.metric_logger", "MetricLogger")
    logger = module.MetricLogger
    hooked = ("record_train_metrics", "write_metrics", "flush_metrics_and_cleanup")
    if not all(hasattr(logger, n) for n in hooked) or not hasattr(module, "max_logging"):
        raise MaxTextHookError(
            f"MaxText {maxtext_version()}'s MetricLogger no longer has {', '.join(hooked)}; "
            f"input_client.maxtext was tested with MaxText "
            f"{', '.join(TESTED_VERSIONS)}."
        )
    return module


def grain_checkpointing() -> ModuleType:
    """`maxtext.common.grain_utility`, checked to be where `checkpointing.load_state_if_possible`
    looks up `for_restore` (the checkpointable that restores the data iterator) at call time."""
    grain = _module_with("maxtext.common.grain_utility", "for_restore")
    loader = _module_with("maxtext.common.checkpointing", "load_state_if_possible")
    reads = set(getattr(getattr(loader.load_state_if_possible, "__code__", None), "co_names", ()))
    if getattr(loader, "grain_utility", None) is not grain or "for_restore" not in reads:
        raise MaxTextHookError(
            f"MaxText {maxtext_version()}'s checkpointing.load_state_if_possible no longer "
            f"restores the data iterator through grain_utility.for_restore, where "
            f"input_client.maxtext reshards a checkpoint of another process count; the "
            f"adapter was tested with MaxText {', '.join(TESTED_VERSIONS)}."
        )
    return grain


def trainer_module() -> ModuleType:
    """`maxtext.trainers.pre_train.train`, MaxText's pre-training entry point (`main(argv)`)."""
    return _module_with("maxtext.trainers.pre_train.train", "main")
