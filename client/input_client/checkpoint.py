"""Orbax checkpointing of the batch iterator's resume state, saved beside the model.

MaxText checkpoints Grain's iterator with an Orbax handler (`GrainCheckpointHandler`) under its
own item name in the same `CheckpointManager` step as the model; this is the same for the
input server's iterator::

    import orbax.checkpoint as ocp
    from input_client.checkpoint import InputStateRestore, InputStateSave

    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), data=InputStateSave(batches)))
    ...
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=InputStateRestore()))
    batches = client.batches(spec, state=restored.data)

Each process writes its own `process_{index}-of-{count}.json` (as Grain's handler does), since
every host streams its own shard and so has its own state; a plain `ocp.args.JsonSave` would
keep one file for all hosts. The state is taken when `InputStateSave` is made, so an
asynchronous save records the batch the model was trained on even if the loop moves on.

This module imports Orbax (and so jax); `import input_client` does not import it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orbax.checkpoint as ocp
from etils import epath


def _state_file(directory: epath.Path) -> epath.Path:
    import jax  # Orbax depends on jax already

    return epath.Path(directory) / f"process_{jax.process_index()}-of-{jax.process_count()}.json"


class InputStateHandler(ocp.CheckpointHandler):
    """Saves and restores this process's iterator state as JSON (Orbax's handler protocol)."""

    def save(self, directory: epath.Path, args: InputStateSave) -> None:
        _state_file(directory).write_text(json.dumps(args.item))

    def restore(
        self, directory: epath.Path, args: InputStateRestore | None = None
    ) -> dict[str, Any] | None:
        path = _state_file(directory)
        if not path.exists():
            raise FileNotFoundError(
                f"{path} does not exist: the checkpoint was written by another number of "
                f"processes, or without an InputStateSave item."
            )
        return json.loads(path.read_text())

    def metadata(self, directory: epath.Path) -> None:
        return None


@ocp.args.register_with_handler(InputStateHandler, for_save=True)
@dataclasses.dataclass
class InputStateSave(ocp.args.CheckpointArgs):
    """Save args: `item` is a `BatchIterator` (its `get_state()` is taken now) or a state.

    Attributes:
      item: the state to save (a JSON-serializable dict, or None before the first batch).
    """

    item: Any

    def __post_init__(self):
        if hasattr(self.item, "get_state"):
            self.item = self.item.get_state()
        json.dumps(self.item)  # fail now, in the training loop, if it cannot be saved


@ocp.args.register_with_handler(InputStateHandler, for_restore=True)
@dataclasses.dataclass
class InputStateRestore(ocp.args.CheckpointArgs):
    """Restore args: the restored item is the state to pass as `client.batches(state=...)`."""
