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
A step written by another number of processes restores too (`load_state`): its states are
resharded onto this run's count (`input_client.reshard`), and the spec's shard must then be
this process's index of this run's count.

This module imports Orbax (and so jax); `import input_client` does not import it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from input_client.elastic import reshard
from input_client.wire import is_resume_state

STATE_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def state_file_name(index: int, count: int) -> str:
    """The file process `index` of `count` keeps its state in (Grain's and MaxText's name)."""
    return f"process_{index}-of-{count}.json"


def _process() -> tuple[int, int]:
    import jax  # Orbax depends on jax already

    return jax.process_index(), jax.process_count()


def load_state(directory: Any, index: int, count: int) -> dict[str, Any] | None:
    """The state process `index` of `count` resumes from, out of a checkpoint step's folder of
    `process_{i}-of-{n}.json` files (this handler's, or MaxText's `iter/`): its own file's;
    when the step was written by another number of processes n, every one of its n states,
    in index order, resharded onto `count` (`input_client.reshard`), the result's `[index]`
    (None: from the start). An empty state (`{}`, `null`) is a process that took no batch:
    None.

    Raises:
      FileNotFoundError: the folder holds no state file, or lacks one of the n.
      ValueError: files of several process counts, an index given twice or past n, a file
        that is not a server's state, or states that do not reshard (another run's).
    """
    directory = epath.Path(directory)
    own = directory / state_file_name(index, count)
    if own.exists():
        return _read_state(own)
    paths = _states_of_one_count(directory, own)
    states = [_read_state(p) for p in paths]
    try:
        return reshard(states, count)[index]
    except ValueError as e:
        raise ValueError(
            f"the {len(paths)} data states in {directory} do not reshard onto {count} "
            f"processes: {e}"
        ) from None


def _states_of_one_count(directory: epath.Path, own: epath.Path) -> list[epath.Path]:
    """The step's state files, in index order: all n of one process count n."""
    found: dict[int, dict[int, list[str]]] = {}
    names = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    for name in names:
        m = STATE_FILE.fullmatch(name)
        if m:
            found.setdefault(int(m[2]), {}).setdefault(int(m[1]), []).append(name)
    if not found:
        raise FileNotFoundError(
            f"{own} does not exist, nor any process_*-of-*.json beside it: the step was saved "
            f"without the data state (no InputStateSave item, or not MaxText's grain dataset)."
        )
    if len(found) > 1:
        counts = " and ".join(str(n) for n in sorted(found))
        raise ValueError(
            f"{directory} holds data states written by {counts} processes: a step is "
            f"written by one process count; remove the files that do not belong to it."
        )
    ((n, indices),) = found.items()
    for i, named in sorted(indices.items()):
        if len(named) > 1 or i >= n:
            what = " and ".join(named) if len(named) > 1 else f"{named[0]} (past {n - 1})"
            raise ValueError(
                f"{directory} names process {i} of {n} more than once or out of range: "
                f"{what}; keep one state file per process, process_{{i}}-of-{n}.json."
            )
    missing = [state_file_name(i, n) for i in range(n) if i not in indices]
    if missing:
        raise FileNotFoundError(
            f"{directory} lacks {', '.join(missing)} of the {n} processes that wrote the step, "
            f"so its data states cannot be resharded onto this run's processes; copy in every "
            f"process's file."
        )
    return [directory / indices[i][0] for i in range(n)]


def _read_state(path: epath.Path) -> dict[str, Any] | None:
    text = path.read_text()
    try:
        state = json.loads(text)
    except ValueError:
        state = text  # refused below, as any other
    if state is None or state == {}:  # a process that had taken no batch
        return None
    if not is_resume_state(state):
        raise ValueError(
            f"{path} holds no input server state ({text[:80]!r}): the step was saved by "
            f"another input pipeline."
        )
    return state


class InputStateHandler(ocp.CheckpointHandler):
    """Saves and restores this process's iterator state as JSON (Orbax's handler protocol);
    a step written by another number of processes restores resharded (`load_state`)."""

    def save(self, directory: epath.Path, args: InputStateSave) -> None:
        path = epath.Path(directory) / state_file_name(*_process())
        path.write_text(json.dumps(args.item))

    def restore(
        self, directory: epath.Path, args: InputStateRestore | None = None
    ) -> dict[str, Any] | None:
        return load_state(directory, *_process())

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
