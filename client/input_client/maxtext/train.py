"""MaxText's own trainer with the input server as its input pipeline.

python -m input_client.maxtext.train --server ADDRESS --spec SPEC.toml [--eval-spec SPEC.toml]
    [--token-file FILE] [<base.yml>] key=value ...

Everything after the adapter's own flags goes to `maxtext.trainers.pre_train.train` unchanged,
except that `dataset_type=grain` and placeholder `grain_train_files` / `grain_eval_files` are
added when missing: MaxText checkpoints a data iterator only for `dataset_type=grain`, and its
config check wants those files named though nothing reads them once the factories are replaced.
"""

from __future__ import annotations

import argparse
import os

from input_client.errors import InputClientError
from input_client.maxtext import MaxTextConfigError, MaxTextHookError, install
from input_client.maxtext._hook import trainer_module
from input_client.maxtext.source import failures
from input_client.spec import PipelineSpec, SpecError

PLACEHOLDER = "input-server"  # what grain_*_files say when the server supplies the data


def _keys(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if "=" in a)


def maxtext_argv(args: list[str]) -> list[str]:
    """MaxText's arguments with what the adapter needs added; raises ValueError if they ask for
    another dataset type. The eval placeholder is added even without an eval spec, so that an
    `eval_interval` without one reaches the adapter's own message, not MaxText's."""
    keys = _keys(args)
    if keys.get("dataset_type", "grain") != "grain":
        raise ValueError(
            f"dataset_type={keys['dataset_type']} would bypass the server; leave it "
            f"out (the launcher sets dataset_type=grain)."
        )
    return [
        *args,
        *(
            f"{k}={v}"
            for k, v in (
                ("dataset_type", "grain"),
                ("grain_train_files", PLACEHOLDER),
                ("grain_eval_files", PLACEHOLDER),
            )
            if k not in keys
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m input_client.maxtext.train",
        description="Runs MaxText's pre-training trainer fed by an input server.",
    )
    parser.add_argument(
        "--server",
        required=True,
        help="the server: unix:///path.sock, unix-abstract:NAME or host:port",
    )
    parser.add_argument("--spec", required=True, help="the training pipeline spec (TOML)")
    parser.add_argument(
        "--eval-spec", help="the eval pipeline spec (TOML); needed when eval_interval > 0"
    )
    parser.add_argument("--token-file", help="the server's token, for TCP or abstract sockets")
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
        spec = PipelineSpec.from_toml(args.spec)
        eval_spec = PipelineSpec.from_toml(args.eval_spec) if args.eval_spec else None
        mt_args = maxtext_argv(args.maxtext)
        install(
            args.server,
            spec,
            eval_spec,
            token_file=args.token_file,
            connect_timeout_s=args.connect_timeout_s,
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
