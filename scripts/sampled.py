"""Runs a Python module with a sampler thread beside it: every `--interval-ms` it reads every
other thread's stack (`sys._current_frames`), and every 2 s writes the stacks counted so far
in py-spy's folded form, a thread's name first (the module may end its process any way it
likes: `serve` exits on SIGTERM from its own handler). For hosts where
py-spy cannot read a process (gVisor); the samples are taken when the sampler gets the GIL,
so a thread's own C work shows at the Python line that called it.

    python3 scripts/sampled.py --out serve.folded -m input_server.cli serve --listen ...
"""

from __future__ import annotations

import argparse
import collections
import os
import runpy
import sys
import threading
import time

WRITE_EVERY_S = 2.0


class Sampler(threading.Thread):
    def __init__(self, interval_s: float, path: str):
        super().__init__(name="sampler", daemon=True)
        self.interval_s, self.path = interval_s, path
        self.counts: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        me = threading.get_ident()
        written = time.monotonic()
        while True:
            time.sleep(self.interval_s)
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
                self.counts[";".join([f"thread {name}", *reversed(stack)])] += 1

    def write(self) -> None:
        with open(self.path + ".part", "w") as f:
            for stack, n in self.counts.most_common():
                f.write(f"{stack} {n}\n")
        os.replace(self.path + ".part", self.path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folded stacks' file")
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        help="sys.setswitchinterval for the module (GIL hand-over)",
    )
    p.add_argument("-m", dest="module", required=True)
    args, rest = p.parse_known_args()
    sampler = Sampler(args.interval_ms / 1000, args.out)
    sys.argv = [args.module, *rest]
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    sampler.start()
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    finally:
        sampler.write()


if __name__ == "__main__":
    main()
