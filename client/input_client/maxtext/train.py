"""MaxText's own trainer with the input server as its input pipeline.

python -m input_client.maxtext.train --server ADDRESS[,ADDRESS...] [--order arrival]
    [--spec SPEC.toml] [--eval-spec SPEC.toml] [--token-file FILE] [--tls] [--tls-ca FILE]
    [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME] [<base.yml>] key=value ...

Everything after the adapter's own flags goes to `maxtext.trainers.pre_train.train`. Without
`--spec`, MaxText's own data keys (`grain_train_files`, `grain_file_type`, `tokenizer_path`,
`packing`, ...) say what the server streams (`input_client.maxtext.derive`), so the arguments go
through unchanged but for `dataset_type=grain`, added when missing: MaxText checkpoints a data
iterator only for that type. A spec file replaces the derived spec: then MaxText's config check
still wants `grain_train_files` (`grain_eval_files` with `--eval-spec`) named though nothing
reads them, so a placeholder is added where they are missing.
"""

from __future__ import annotations

import argparse
import os

from input_client.errors import InputClientError
from input_client.maxtext import MaxTextConfigError, MaxTextHookError, install
from input_client.maxtext._hook import trainer_module
from input_client.maxtext.source import failures
from input_client.spec import PipelineSpec, SpecError
from input_client.tls_flags import add_tls_arguments, tls_options

PLACEHOLDER = "input-server"  # what grain_*_files say when a spec file supplies the data
# Keys that name MaxText's training data (its config check wants one of them with grain).
TRAIN_DATA = ("grain_train_files", "grain_train_mixture_config_path", "dataset_path", "hf_path")
EVAL_DATA = ("grain_eval_files", "dataset_path", "hf_path")


def _keys(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if "=" in a)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:  # MaxText's own config check names it
        return None


def maxtext_argv(args: list[str], *, train_spec: bool, eval_spec: bool) -> list[str]:
    """MaxText's arguments with what the adapter needs added, for a launch with (`train_spec`,
    `eval_spec`) or without spec files.

    Raises:
      ValueError: they ask for another dataset type, or, with no config file among them (whose
        keys the launcher does not read), they name no training data or an `eval_interval` with
        no eval data, where no spec file supplies it.
    """
    keys = _keys(args)
    if keys.get("dataset_type", "grain") != "grain":
        raise ValueError(
            f"dataset_type={keys['dataset_type']} would bypass the server; leave it "
            f"out (the launcher sets dataset_type=grain)."
        )
    yml = bool(args) and args[0].endswith(".yml")  # MaxText's own test for a config file
    if not (train_spec or yml or any(keys.get(k) for k in TRAIN_DATA)):
        raise ValueError(
            "no training data named: give MaxText's grain_train_files=PATTERN (a glob, or "
            "'a*,0.3;b*,0.7') or grain_train_mixture_config_path=FILE.json, or --spec SPEC.toml."
        )
    interval = _int(keys.get("eval_interval"))
    if not (eval_spec or yml or (interval or 0) <= 0 or any(keys.get(k) for k in EVAL_DATA)):
        raise ValueError(
            f"eval_interval={interval} asks for eval batches but no eval spec was given: give "
            f"MaxText's grain_eval_files=PATTERN, or --eval-spec SPEC.toml."
        )
    added = [("dataset_type", "grain")]
    if train_spec:
        added.append(("grain_train_files", PLACEHOLDER))
    if eval_spec:
        added.append(("grain_eval_files", PLACEHOLDER))
    return [*args, *(f"{k}={v}" for k, v in added if k not in keys)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m input_client.maxtext.train",
        description="Runs MaxText's pre-training trainer fed by an input server.",
    )
    parser.add_argument(
        "--server",
        required=True,
        help="the server: unix:///path.sock, unix-abstract:NAME or host:port; several "
        "host:port, comma-separated, fan in from a pool (server j streams sub-shard j)",
    )
    parser.add_argument(
        "--order",
        choices=("round_robin", "arrival"),
        default="round_robin",
        help="with several servers: batch k from server k mod N (reproducible; the default), "
        "or whichever server's batch is ready first (arrival)",
    )
    parser.add_argument(
        "--spec",
        help="the training pipeline spec (TOML); default: derived from MaxText's config "
        "(grain_train_files, tokenizer_path, max_target_length, ...)",
    )
    parser.add_argument(
        "--eval-spec",
        help="the eval pipeline spec (TOML); default: derived from MaxText's grain_eval_files",
    )
    parser.add_argument("--token-file", help="the server's token, for TCP or abstract sockets")
    add_tls_arguments(parser)
    parser.add_argument(
        "--connect-timeout-s",
        type=float,
        default=30.0,
        help="how long to wait for the server before giving up (default 30)",
    )
    parser.add_argument(
        "maxtext",
        nargs=argparse.REMAINDER,
        help="MaxText's own arguments: [base.yml] key=value ...",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")  # MaxText's switch for hosts off GCP
    try:
        spec = PipelineSpec.from_toml(args.spec) if args.spec else None
        eval_spec = PipelineSpec.from_toml(args.eval_spec) if args.eval_spec else None
        mt_args = maxtext_argv(
            args.maxtext, train_spec=spec is not None, eval_spec=eval_spec is not None
        )
        install(
            args.server,
            spec,
            eval_spec,
            token_file=args.token_file,
            connect_timeout_s=args.connect_timeout_s,
            **tls_options(args),
            order=args.order,
        )
        trainer = trainer_module()
    except (SpecError, OSError, ValueError, MaxTextHookError) as e:
        parser.exit(2, f"{parser.prog}: {e}\n")
    from absl import app

    try:
        app.run(trainer.main, argv=[trainer.__file__, *mt_args])
    except (MaxTextConfigError, ConnectionError, InputClientError) as e:
        if e not in failures:  # before any batch: the set-up's mistake
            parser.exit(2, f"{parser.prog}: {e}\n")
    except SystemExit as e:
        if e.code or not failures:
            raise
    # A data stream failed: MaxText ends training "stopped" (exit 0) after a failed `next()`
    # and lets one in eval through; either way the failure is the run's.
    parser.exit(1, f"{parser.prog}: the data stream failed: {failures[-1]}\n")


if __name__ == "__main__":
    main()
