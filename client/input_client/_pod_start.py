"""After a timer's first step, before its gather is built, every JAX process meets in the
distributed runtime's key-value store: a late host's start-up is waited for in Python, with a
bound that names the hosts missing and a SIGTERM that still ends the wait, never inside a
collective.

Why not let the gather wait: compiling it waits for every process, and on CPU (gloo) a
collective's first run connects the processes
through the same key-value store under a fixed deadline (`Gloo context initialization failed:
DEADLINE_EXCEEDED: GetKeyValue() timed out`), so a host whose first batch came later than that
failed the other processes' gather, and the late host then waited forever for peers that had
given up. Once connected, later collectives wait for a late peer without a deadline.

And a process blocked in a collective does not stop on SIGTERM: `jax.distributed.initialize`
installs the preemption service's SIGTERM handler (`jax_enable_preemption_service`, on by
default), which only records a preemption notice in the key-value store for
`multihost_utils.reached_preemption_sync_point`.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("input_client.timing")

# The key the preemption service (XLA's `PreemptionSyncManager`) writes when any process of the
# job catches SIGTERM: every process can read it, so one process's signal is the pod's notice.
PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"

# How often a waiting process looks at the store: short enough that a SIGTERM ends the wait
# without a noticeable delay, long enough that a pod of many hosts waiting costs the
# coordinator little.
POLL_S = 0.25

# Aliases, so tests can put a fake clock and sleep in their place.
monotonic = time.monotonic
sleep = time.sleep

# Timers are numbered in the order a process makes them, the same order on every process (their
# gathers are collectives), so the n-th timer of each process meets under the same name.
_timers = itertools.count()


def distributed_client() -> Any:
    """JAX's distributed runtime client, or None where `jax.distributed` was not initialized
    (a runtime that runs several processes without it has no store to meet in)."""
    from jax._src import distributed  # no public name: `multihost_utils` reads it the same way

    return distributed.global_state.client


def next_meeting_name() -> str:
    """The store directory of this process's next timer: the same on every process."""
    return f"input_client/step_timer/{next(_timers)}"


def _try_get(client: Any, key: str) -> str | None:
    try:
        return client.key_value_try_get(key)
    except RuntimeError as e:  # JAX's runtime error carries the store's status as text
        if "NOT_FOUND" in str(e):
            return None
        raise


def _propose(client: Any, key: str, value: str) -> None:
    """Writes the pod's decision unless another process wrote one first: the first one stands,
    so every process follows the same."""
    try:
        client.key_value_set(key, value)
    except RuntimeError as e:
        if "ALREADY_EXISTS" not in str(e):
            raise


def meet(
    client: Any,
    name: str,
    *,
    process: int,
    processes: int,
    wait_s: float,
    on_notice: Callable[[str], None] | None = None,
) -> tuple[int, ...]:
    """Waits until every process has arrived under `name`, or until `wait_s` has passed.

    The pod decides once (the first decision written to the store stands): gather, when every
    process arrived; or not, naming the processes missing when one process's wait ran out. A
    process arriving after the decision follows it.

    Args:
      client: JAX's distributed runtime client (`distributed_client()`).
      name: the meeting's store directory (`next_meeting_name()`).
      process: this process's index.
      processes: how many processes the pod has.
      wait_s: how long this process waits for the others.
      on_notice: called with a message when a preemption notice appears while waiting; default
        `stop_as_sigterm_would`.

    Returns:
      The processes that had not arrived when the pod gave up waiting; empty: every process
      arrived, gather.
    """
    notice = stop_as_sigterm_would if on_notice is None else on_notice
    client.key_value_set(f"{name}/arrived/{process}", str(os.getpid()))
    decision_key = f"{name}/decision"
    start = monotonic()
    while True:
        decided = _try_get(client, decision_key)
        if decided is not None:
            return tuple(int(p) for p in decided.split(",") if p)
        arrived = {
            int(key.rsplit("/", 1)[1]) for key, _ in client.key_value_dir_get(name + "/arrived/")
        }
        missing = [p for p in range(processes) if p not in arrived]
        if not missing:
            _propose(client, decision_key, "")
            continue
        if _try_get(client, PREEMPTION_NOTICE_KEY) is not None:
            notice(
                f"StepTimer: a preemption notice (SIGTERM) reached the pod while process "
                f"{process} waited for processes {missing} to finish their first step; ending "
                "this process as SIGTERM would: jax.distributed's preemption service caught the "
                "signal, and a pod missing a host cannot reach the step it would checkpoint at."
            )
            return tuple(missing)
        if monotonic() - start >= wait_s:
            _propose(client, decision_key, ",".join(map(str, missing)))
            continue
        sleep(POLL_S)


def stop_as_sigterm_would(message: str) -> None:
    """Logs `message` and ends this process with SIGTERM's default action (the preemption
    service's handler, which caught the signal, is put aside)."""
    log.error(message)
    # The process ends without unwinding: what the handlers hold must be written first.
    for handler in (*logging.getLogger().handlers, logging.lastResort):
        if handler is not None:
            handler.flush()
    sys.stderr.flush()
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread, where Python alone may change a handler
        os._exit(128 + signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    # Reached only where this thread blocks the signal: the process still ends.
    time.sleep(1)
    os._exit(128 + signal.SIGTERM)
