"""One process of the pod test (`test_pod_view.py`): a JAX CPU process of a multi-process job
that trains on batches from its own input server, timed by `StepTimer`, then restarts its
stream (a new timer, the stream resumed from its state) and trains again. It writes what each
run saw as JSON: its own records, the gathered steps, the summary and the iterator's wait.

python tests/integration/pod_trainer.py --process-id I --processes N --port P --server T
  --steps S --out OUT.json --badput BADPUT.jsonl --records RECORDS.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--processes", type=int, required=True)
    p.add_argument("--port", type=int, required=True, help="the JAX coordinator's port")
    p.add_argument("--server", required=True, help="this process's input server")
    p.add_argument("--steps", type=int, required=True, help="steps a run")
    p.add_argument("--pod-every", type=int, default=4)
    p.add_argument(
        "--step-s", type=float, default=0.01, help="the device's time a step, stood in for"
    )
    p.add_argument("--out", required=True)
    p.add_argument("--badput", required=True)
    p.add_argument("--records", required=True)
    args = p.parse_args()

    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.processes,
        process_id=args.process_id,
        initialization_timeout=60,
    )
    from input_client import InputClient, StepTimer

    @jax.jit
    def compute(batch):
        return (batch["inputs"] * 2 + batch["targets"]).sum()

    def train_step(batch):
        # A real step's length, slept: a fed process's few-ms hiccups on a busy host stay well
        # under 5 % of a step, as on a real pod, instead of swamping a microsecond step.
        time.sleep(args.step_s)
        return compute(batch)

    runs = []
    state = None
    with InputClient(args.server, connect_timeout_s=30) as client:
        for _ in range(2):  # the second run is the restart: a new stream from the saved state
            with client.batches("p", state=state, prefetch=2) as batches:
                # The stream opens in the background: the first step's data wait is the wait
                # for the run's first batch.
                timer = StepTimer(
                    data_source=batches,
                    pod_every=args.pod_every,
                    badput_path=args.badput,
                    records_path=args.records,
                )
                for _, batch in zip(range(args.steps), batches, strict=False):
                    timer.step(train_step, batch)
                timer.flush()
                state = batches.get_state()
                runs.append(
                    {
                        "run": timer.run_id,
                        "records": [dataclasses.asdict(r) for r in timer.records],
                        "pod_steps": [dataclasses.asdict(s) for s in timer.pod_steps],
                        "summary": timer.summary(),
                        "wait_time_s": batches.wait_time_s,
                        "badput": dataclasses.asdict(timer.badput()),
                    }
                )
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"process": jax.process_index(), "runs": runs}, f)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
