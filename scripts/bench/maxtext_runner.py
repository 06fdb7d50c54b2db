"""Runs MaxText's trainer inside its own venv and reports how long it waited for data.

    $MAXTEXT_PYTHON scripts/bench/maxtext_runner.py \
        '{"server": ADDRESS, "spec": SPEC.toml, "badput": FILE}' key=value ...
        # "spec" and "badput" optional (the launcher's --spec and --badput); '{}' for MaxText's
        # own input pipeline

Used by scripts/bench/bench_maxtext.py and scripts/tpu/maxtext_run.sh. It times
`DataLoader.load_next_batch_pre_sharding` (the `next()` on the data iterator, before the batch
is put on devices) for every step, and prints one line `BENCH {json}` at the end: each wait's
start (seconds since this process started) and length; it exits with the trainer's status. It
imports only MaxText and input_client, which is all that venv has.
"""

from __future__ import annotations

import json
import os
import sys
import time

STARTED = time.perf_counter()


def main() -> None:
    options, maxtext_args = json.loads(sys.argv[1]), sys.argv[2:]
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")
    from maxtext.common import data_loader

    waits: list[tuple[float, float]] = []
    load = data_loader.DataLoader.load_next_batch_pre_sharding

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return load(self, *args, **kwargs)
        finally:
            waits.append((start - STARTED, time.perf_counter() - start))

    data_loader.DataLoader.load_next_batch_pre_sharding = timed
    code = 0
    try:
        if options.get("server"):  # the launcher, as a user runs it
            from input_client.maxtext import train as launcher

            flags = ["--server", options["server"]]
            for key in ("spec", "badput"):
                flags += [f"--{key}", options[key]] if options.get(key) else []
            launcher.main([*flags, *maxtext_args])
        else:  # MaxText's own trainer and input pipeline
            from absl import app
            from maxtext.trainers.pre_train import train

            app.run(train.main, argv=[train.__file__, *maxtext_args])
    except SystemExit as e:
        code = e.code or 0
    print(
        "BENCH " + json.dumps({"waits": waits, "wall_s": time.perf_counter() - STARTED}), flush=True
    )
    sys.exit(code)


if __name__ == "__main__":
    main()
