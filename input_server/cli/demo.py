"""`input-server demo`: a server, a client and a tiny JAX language model, all in one process.

Offline and argument-free: it builds (once, then cached) a corpus of the standard library's
docstrings and a sentencepiece model, serves them on a temporary Unix socket, streams packed
MaxText-format batches through the real client, trains a one-layer decoder on them while
`StepTimer` keeps device time and data wait apart, and prints what it measured. It fails (exit
status 1) if the loss does not go down, so it doubles as an end-to-end smoke test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from typing import Any

from input_server.cli.demo_decoder import (
    LEAST,
    LOSS_WINDOW,
    MODEL_KEYS,
    adam_init,
    count_params,
    init_params,
    train_step,
)


def _workers_of(client: Any) -> tuple[str, str, str]:
    """The worker processes, threads and reason the server reports for our stream."""
    try:
        streams = list(client.info().streams)
    except Exception:  # the demo reports what it can; the info call is not what it shows
        return "unknown", "unknown", ""
    if not streams:
        return "unknown", "unknown", ""
    s = streams[-1]
    return str(s.worker_processes), str(s.worker_threads), s.worker_reason


def _check_sizes(steps: int, seq_len: int, batch_size: int) -> None:
    """Raises ValueError for a size under its least (`LEAST`)."""
    for name, value in (("steps", steps), ("seq_len", seq_len), ("batch_size", batch_size)):
        least = LEAST[name]
        if value < least:
            raise ValueError(f"`{name}` must be at least {least}, got {value}.")


def _demo_spec(assets_dir, seq_len: int, batch_size: int, say) -> tuple[Any, str, str]:
    """The demo's spec, corpus and model (built once, then cached)."""
    from input_client import PipelineSpec
    from input_server.data.builtin_corpora import ensure_demo_assets

    say("building the corpus and tokenizer (cached after the first run)...")
    corpus_jsonl, spm_model = ensure_demo_assets(assets_dir)
    spec = PipelineSpec(
        source={"paths": [corpus_jsonl]},
        tokenizer={"model": spm_model},
        batch={"seq_len": seq_len, "size": batch_size},
        order={"epochs": 0},
    )
    return spec, corpus_jsonl, spm_model


def _model(seq_len: int, batch_size: int) -> dict[str, Any]:
    """The decoder's initial train state, its size, its compiled step and its FLOPs a step."""
    import jax

    params = init_params(jax.random.PRNGKey(0), seq_len=seq_len)
    num_params = count_params(params)
    tokens_per_step = batch_size * seq_len
    return {
        "state": {"params": params, "opt": adam_init(params)},
        "num_params": num_params,
        "tokens_per_step": tokens_per_step,
        # The usual dense-transformer estimate (forward + backward = 6 FLOPs per parameter
        # per token); it leaves out attention's seq_len^2 term, small at this length.
        "flops_per_step": 6.0 * num_params * tokens_per_step,
        "train_step": jax.jit(train_step),
    }


def _serve(stack: contextlib.ExitStack, workdir, corpus_jsonl: str, spm_model: str, say) -> str:
    """Starts the demo's server on a Unix socket in `workdir` (default a temporary folder,
    closed with `stack`, as the server is) and returns its target."""
    from input_server.serving.server import Server, ServerConfig

    if workdir is None:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="input-server-"))
    sock_path = os.path.join(os.fspath(workdir), "demo.sock")
    # The demo's corpus and model are the only data its server may read.
    server = stack.enter_context(
        Server(
            ServerConfig(
                listen=[f"unix://{sock_path}"],
                data_roots=[
                    os.path.dirname(os.path.abspath(corpus_jsonl)),
                    os.path.dirname(os.path.abspath(spm_model)),
                ],
            )
        )
    )
    target = server.targets[0]
    say(f"server listening on {target}")
    return target


def _train(stack, client, it, timer, model: dict[str, Any], steps: int, progress: bool):
    """Trains `steps` steps on the stream `it`; returns the losses and the server's workers."""
    from tqdm import tqdm

    losses: list[float] = []
    state = model["state"]
    workers = ("unknown", "unknown", "")
    bar = stack.enter_context(
        tqdm(
            total=steps,
            desc="train",
            unit="step",
            disable=not (progress and sys.stderr.isatty()),
        )
    )
    for i in range(steps):
        batch = next(it)
        if i == 0:
            # Asked while the stream runs, so the server lists it with its worker count.
            workers = _workers_of(client)
        inputs = {k: batch[k] for k in MODEL_KEYS}
        state, metrics = timer.step(model["train_step"], state, inputs)
        losses.append(float(metrics["loss"]))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        bar.update()
    return losses, workers


def run_demo(
    *,
    steps: int = 50,
    seq_len: int = 128,
    batch_size: int = 8,
    workdir: str | os.PathLike | None = None,
    progress: bool = True,
    assets_dir: str | os.PathLike | None = None,
    records: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Serves the demo corpus, streams it through the client and trains on it.

    Args:
      steps: train steps (the first compiles and is left out of the timing figures).
      seq_len: tokens per packed row.
      batch_size: rows per batch.
      workdir: folder for the server's Unix socket; default a fresh temporary folder.
      progress: show a progress bar (only on a terminal) and stage messages on stderr.
      assets_dir: where the corpus and tokenizer are built; default the user's cache.
      records: a file each step's `StepTimer` record is appended to, as a JSON line
        (`input-server plot-steps` draws it).

    Returns:
      What was measured: the `StepTimer` summary's figures, the worker counts the server
      used, the losses, `first_loss` / `last_loss` (means of the first and last
      `LOSS_WINDOW` steps), `loss_decreased` and `wall_s`.

    Raises:
      ValueError: fewer than 2 steps (the loss of the first and the last are compared), or a
        size that is not positive.
    """
    _check_sizes(steps, seq_len, batch_size)
    start = time.perf_counter()

    def say(msg: str) -> None:
        if progress:
            print(f"[demo {time.perf_counter() - start:5.1f}s] {msg}", file=sys.stderr, flush=True)

    from input_server.batching.grain_adapter import ensure_absl_flags_parsed

    ensure_absl_flags_parsed()  # before jax and Grain are imported (by the steps below)
    from input_client import InputClient, StepTimer

    spec, corpus_jsonl, spm_model = _demo_spec(assets_dir, seq_len, batch_size, say)
    model = _model(seq_len, batch_size)
    with contextlib.ExitStack() as stack:
        target = _serve(stack, workdir, corpus_jsonl, spm_model, say)
        client = stack.enter_context(InputClient(target))
        it = stack.enter_context(client.batches(spec, prefetch=2))
        timer = StepTimer(
            tokens_per_step=model["tokens_per_step"],
            flops_per_step=model["flops_per_step"],
            data_source=it,
            records_path=records,
        )
        say(
            f"training a {model['num_params']:,}-parameter decoder for {steps} steps "
            f"(batch {batch_size} x {seq_len} tokens)..."
        )
        losses, workers = _train(stack, client, it, timer, model, steps, progress)

    return {
        **_result(timer, model, losses, workers, steps=steps, seq_len=seq_len, batch=batch_size),
        "wall_s": time.perf_counter() - start,
    }


def _result(timer, model, losses, workers, *, steps: int, seq_len: int, batch: int) -> dict:
    """`run_demo`'s figures but its wall time: the timer's, the workers', the losses'."""
    window = min(LOSS_WINDOW, max(1, steps // 2))
    first_loss = sum(losses[:window]) / window
    last_loss = sum(losses[-window:]) / window
    return {
        **timer.summary(),
        "steps_run": steps,
        "seq_len": seq_len,
        "batch_size": batch,
        "num_params": model["num_params"],
        "worker_processes": workers[0],
        "worker_threads": workers[1],
        "worker_reason": workers[2],
        "losses": losses,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "loss_window": window,
        "loss_decreased": last_loss < first_loss,
        "timing_table": timer.format_summary(),
    }


def format_report(result: dict[str, Any]) -> str:
    """The demo's result as a small table: the timer's figures, the workers, the loss."""
    w = result["loss_window"]
    verdict = "down" if result["loss_decreased"] else "NOT down"
    rows = [line.split("  ", 1) for line in result["timing_table"].splitlines()]
    rows += [
        ("worker processes", str(result["worker_processes"])),
        ("worker threads", str(result["worker_threads"])),
        (f"loss, first {w} steps", f"{result['first_loss']:.4f}"),
        (f"loss, last {w} steps", f"{result['last_loss']:.4f}  ({verdict})"),
        ("wall time", f"{result['wall_s']:.1f} s"),
    ]
    width = max(len(label.strip()) for label, _ in rows)
    lines = [
        f"input-server demo: {result['num_params']:,}-parameter decoder, batch "
        f"{result['batch_size']} x {result['seq_len']}"
    ]
    lines += [f"  {label.strip():<{width}}  {value.strip()}" for label, value in rows]
    if result["worker_reason"]:
        lines.append(f"  (workers: {result['worker_reason']})")
    return "\n".join(lines)


def _at_least(least: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be an integer of at least {least}, got {text}")
        return value

    return parse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="train a tiny JAX model through the server, offline"
    )
    parser.add_argument(
        "--steps",
        type=_at_least(LEAST["steps"]),
        default=50,
        help="train steps (the first compiles and is not timed)",
    )
    parser.add_argument(
        "--seq-len", type=_at_least(LEAST["seq_len"]), default=128, help="tokens per row"
    )
    parser.add_argument(
        "--batch-size", type=_at_least(LEAST["batch_size"]), default=8, help="rows per batch"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--records",
        metavar="FILE.jsonl",
        help="append each step's record to FILE as a JSON line (input-server plot-steps FILE)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the demo and prints its report; 0 if the loss went down, 1 if it did not."""
    if args.records:  # a file that cannot be written is said before the demo runs (OSError)
        open(args.records, "a", encoding="utf-8").close()
    result = run_demo(
        records=args.records,
        steps=args.steps,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    print(format_report(result))
    if not result["loss_decreased"]:
        print(
            f"error: the loss did not go down ({result['first_loss']:.4f} -> "
            f"{result['last_loss']:.4f}).",
            file=sys.stderr,
        )
        return 1
    return 0
