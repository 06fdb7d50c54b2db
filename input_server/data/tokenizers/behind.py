"""A fast backend loaded behind a stream: the reference serves its first groups while a thread
loads the backend and runs the gate (`route.Router`); which backends may, and when the load
starts."""

from __future__ import annotations

import threading

# The backends that may load behind a stream (`Router.load_behind`). Not kitoken: a server
# loading it behind a sentencepiece stream died in 3 of 7 tries on the 2-core host (no Python
# error; never without it), and it loads in tens of ms.
LOADS_BEHIND = ("fastokens",)
# A backend loading behind the stream starts once the reference has finished this many groups
# (a group is about `pipeline.GROUP_CHARS` of text: one or more first batches), or after
# LOAD_AFTER_S, or at once when a worker process needs the choice (`settle`). Loaded beside
# the first group, Llama 3's tokenizer.json held it up on the TPU host, more than the
# backend's speed gave back (docs/benchmarks.md, "Time to a first batch after a (re)start");
# a later start (2 groups, 2 s) left a slow or short stream's groups to the reference longer.
LOAD_AFTER_GROUPS = 1
LOAD_AFTER_S = 1.0


class Behind:
    """A backend being loaded and gated on a thread while the reference serves."""

    def __init__(self):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.go = threading.Event()  # the load may start (`LOAD_AFTER_GROUPS`)
        self.groups = 0  # the groups the reference began meanwhile
        self.finished = 0  # and finished

    def wait_to_start(self) -> None:
        """Until the load may start: LOAD_AFTER_GROUPS finished, `go` set, or LOAD_AFTER_S."""
        self.go.wait(LOAD_AFTER_S)

    def finished_one(self) -> None:
        """The reference finished a group while the backend waited or loaded."""
        with self.lock:
            self.finished += 1
            if self.finished >= LOAD_AFTER_GROUPS:
                self.go.set()
