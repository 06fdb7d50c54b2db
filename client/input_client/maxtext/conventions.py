"""The client's batches in the exact form of MaxText's Grain pretraining pipeline.

The plain client follows the arrays as they travel (`input_client.wire.expand_packed`): every
`targets*` array is its `inputs*` array shifted left with 0 at the end. MaxText 0.2.5's Grain
pipeline differs in three ways, which this module reproduces from its code:

- `ShiftData` shifts only `targets` and `targets_segmentation`: `targets_position` stays equal to
  `inputs_position`.
- the shifted-in last target is the tokenizer's pad id (`get_tokenizer_and_pad_id`: sentencepiece's
  `pad_id()`, -1 for a model without a pad piece), and `targets_segmentation` is 0 wherever the
  target equals the pad id.
- rows that hold no document (the end of a finite stream) are whole rows of the pad id in every
  array, as `grain.experimental.batch_and_pad` pads a last partial batch; with packing "none",
  each row's padding is the pad id in `inputs`, `inputs_segmentation` and both positions, as
  `PadOrTrimToMaxLength` pads (with packing, Grain's packer pads with 0).
"""

from __future__ import annotations

import numpy as np


def to_maxtext(batch: dict[str, np.ndarray], pad_id: int, packing: str) -> dict[str, np.ndarray]:
    """MaxText's six int32 arrays from a client batch (`input_client.wire.FIELDS`).

    Only the `inputs*` arrays are read; they are copied only where padding must be rewritten,
    and `targets_position` is the same array as `inputs_position`, as in MaxText's batches."""
    inputs, segmentation, position = (
        np.asarray(batch[k], dtype=np.int32)
        for k in ("inputs", "inputs_segmentation", "inputs_position")
    )
    real = segmentation != 0
    # With packing, only rows with no document are padding (Grain's packer pads with 0).
    padding = ~real if packing == "none" else ~real.any(axis=1, keepdims=True) & ~real
    if padding.any():
        inputs, segmentation, position = (
            np.where(padding, np.int32(pad_id), a) for a in (inputs, segmentation, position)
        )
    targets = np.empty_like(inputs)
    targets[:, :-1] = inputs[:, 1:]
    targets[:, -1] = pad_id
    targets_segmentation = np.zeros_like(segmentation)
    targets_segmentation[:, :-1] = segmentation[:, 1:]
    targets_segmentation[targets == pad_id] = 0
    return {
        "inputs": inputs,
        "inputs_position": position,
        "inputs_segmentation": segmentation,
        "targets": targets,
        "targets_position": position,
        "targets_segmentation": targets_segmentation,
    }
