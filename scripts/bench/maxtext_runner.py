"""Runs MaxText's trainer inside its own venv and reports how long it waited for data.

    $MAXTEXT_PYTHON scripts/bench/maxtext_runner.py '{"server": ADDRESS, "spec": SPEC.toml}' \
        key=value ...        # or '{}' for MaxText's own input pipeline

Used by scripts/bench/bench_maxtext.py. It times `DataLoader.load_next_batch_pre_sharding` (the
`next()` on the data iterator, before the batch is put on devices) for every step, and prints
one line `BENCH {json}` at the end: each wait's start (seconds since this process started) and
length. It imports only MaxText and input_client, which is all that venv has.
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
    try:
        if options.get("server"):  # the launcher, as a user runs it
            from input_client.maxtext import train as launcher

            launcher.main(["--server", options["server"], "--spec", options["spec"], *maxtext_args])
        else:  # MaxText's own trainer and input pipeline
            from absl import app
            from maxtext.trainers.pre_train import train

            app.run(train.main, argv=[train.__file__, *maxtext_args])
    except SystemExit as e:
        if e.code:
            raise
    print(
        "BENCH " + json.dumps({"waits": waits, "wall_s": time.perf_counter() - STARTED}), flush=True
    )


if __name__ == "__main__":
    main()
