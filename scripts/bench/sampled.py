"""Runs a Python module with a sampler thread beside it: every `--interval-ms` it reads every
other thread's stack (`sys._current_frames`), and every 2 s writes the stacks counted so far
in py-spy's folded form, a thread's name first (the module may end its process any way it
likes: `serve` exits on SIGTERM from its own handler). For hosts where
py-spy cannot read a process (gVisor); the samples are taken when the sampler gets the GIL,
so a thread's own C work shows at the Python line that called it.

    python3 scripts/bench/sampled.py --out serve.folded -m input_server.cli serve --listen ...
    python3 scripts/bench/sampled.py --summary serve.folded [--top 30]

`--summary` reads folded stacks back: each thread's samples and its busy share (the samples
whose innermost frame is not a wait: a lock, a queue, a condition, a sleep, a poll), then the
busiest places, the innermost three frames each.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import runpy
import sys
import threading
import time

WRITE_EVERY_S = 2.0


# A sample whose innermost frame is one of these waits: its thread is not busy.
WAITS = re.compile(
    r"^(wait|get|acquire|_wait_once|select|poll|sleep|_next|result|join|_recv|recv|accept"
    r"|_wait_for_tstate_lock|_serve|run_forever|_run_once|wait_for|get_nowait|_get)$"
)


class Sampler(threading.Thread):
    def __init__(self, interval_s: float, path: str):
        super().__init__(name="sampler", daemon=True)
        self.interval_s, self.path = interval_s, path
        self.counts: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()  # the counts, between this thread and the last write
        self.stopped = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        written = time.monotonic()
        while not self.stopped.wait(self.interval_s):
            if time.monotonic() - written > WRITE_EVERY_S:
                self.write()
                written = time.monotonic()
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                stack = []
                while frame is not None:
                    code = frame.f_code
                    stack.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
                    frame = frame.f_back
                name = names.get(ident, str(ident))
                with self.lock:
                    self.counts[";".join([f"thread {name}", *reversed(stack)])] += 1

    def write(self) -> None:
        with self.lock:
            with open(self.path + ".part", "w") as f:
                for stack, n in self.counts.most_common():
                    f.write(f"{stack} {n}\n")
            os.replace(self.path + ".part", self.path)


def summary(path: str, top: int) -> None:
    """Each thread's samples and busy share, then the `top` busiest places."""
    samples: collections.Counter[str] = collections.Counter()
    busy: collections.Counter[str] = collections.Counter()
    places: collections.Counter[tuple[str, str]] = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, n = line.rsplit(" ", 1)
            frames = stack.split(";")
            thread = re.sub(r"[-_ ]?\d+$", "", frames[0])
            samples[thread] += int(n)
            if WAITS.match(frames[-1].split(" (")[0]):
                continue
            busy[thread] += int(n)
            where = " <- ".join(f.rsplit("/", 1)[-1] for f in frames[:0:-1][:3])
            places[(thread, where)] += int(n)
    for thread, n in samples.most_common():
        print(f"{thread[:50]:50s} samples {n:7d} busy {busy[thread] / n:6.1%}")
    for (thread, where), n in places.most_common(top):
        print(f"{n:7d} {thread[:30]:30s} {where[:180]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--summary", metavar="FOLDED", help="read a folded file back and say it")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", help="the folded stacks' file")
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        help="sys.setswitchinterval for the module (GIL hand-over)",
    )
    p.add_argument("-m", dest="module")
    # Everything from -m MODULE on is the module's own: parsed as such, not as this script's.
    own = sys.argv[1 : sys.argv.index("-m") + 2] if "-m" in sys.argv else sys.argv[1:]
    rest = sys.argv[len(own) + 1 :]
    args = p.parse_args(own)
    if args.summary:
        summary(args.summary, args.top)
        return
    if not (args.out and args.module):
        p.error("--out FILE and -m MODULE, or --summary FOLDED")
    sampler = Sampler(args.interval_ms / 1000, args.out)
    sys.argv = [args.module, *rest]
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    sampler.start()
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    finally:
        sampler.stopped.set()
        sampler.join(timeout=1.0)
        sampler.write()


if __name__ == "__main__":
    main()
