"""A MaxText checkpoint restored on another number of processes: the data states resharded.

MaxText 0.2.5 saves the data iterator of each process as `iter/process_{i}-of-{n}.json` and
restores it through `grain_utility.for_restore(checkpoint_manager, step, data_iterator,
expansion_factor_real_data)`, which `checkpointing.load_state_if_possible` looks up at call
time. On another process count than the step's, its own refuses: fewer processes assert
("please set expansion_factor_real_data", which feeds some hosts padding), more raise
ValueError. For the server's iterator, `for_restore` here returns a checkpointable that reads
the process's own file or, when the step was written by another count, reshards all of them
(`input_client.checkpoint.load_state`); any other iterator is MaxText's own business.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from input_client.maxtext._hook import grain_checkpointing
from input_client.maxtext.check import MaxTextConfigError
from input_client.maxtext.source import ServerIterator
from input_client.wire import encode_state

# The restore functions this module installed: hooking twice would wrap its own wrapper.
_INSTALLED: set[Any] = set()


class ServerStateCheckpointable:
    """Orbax v1's `StatefulCheckpointable` (save, load) for restoring a `ServerIterator`."""

    def __init__(self, iterator: ServerIterator):
        self._iterator = iterator

    async def save(self, directory: Any) -> Any:
        # MaxText saves through its own checkpointable (`grain_utility.for_save`).
        raise NotImplementedError("restore only: MaxText saves the data state itself.")

    async def load(self, directory: Any) -> Any:
        import jax

        from input_client.checkpoint import load_state  # imports Orbax, as MaxText has

        # All of it now, in Orbax's first phase: an exception from the awaitable returned
        # reaches MaxText wrapped in Orbax's "incompatible handler" error, one from here as it
        # is, and the launcher says it in one line.
        index, count = jax.process_index(), jax.process_count()
        try:
            state = await asyncio.to_thread(load_state, directory, index, count)
        except (OSError, ValueError) as e:
            raise MaxTextConfigError(f"cannot restore the data position: {e}") from None
        self._iterator.set_state(encode_state(state or {}))
        return _done()


async def _done() -> None:
    return None


def hook_restore() -> None:
    """Makes MaxText restore the server's iterator through `ServerStateCheckpointable` (once).

    Raises:
      MaxTextHookError: this MaxText restores its data iterator elsewhere.
    """
    module = grain_checkpointing()
    if module.for_restore in _INSTALLED:
        return
    original = module.for_restore

    @functools.wraps(original)
    def for_restore(checkpoint_manager, step, data_iterator, expansion_factor_real_data):
        local = getattr(data_iterator, "local_iterator", None)
        if isinstance(local, ServerIterator):
            return ServerStateCheckpointable(local)
        return original(checkpoint_manager, step, data_iterator, expansion_factor_real_data)

    _INSTALLED.add(for_restore)
    module.for_restore = for_restore
