"""MaxText's own trainer with the input server as its input pipeline.

python -m input_client.maxtext.train --server ADDRESS[,ADDRESS...] [--order arrival]
    [--spec SPEC.toml] [--eval-spec SPEC.toml] [--token-file FILE] [--tls] [--tls-ca FILE]
    [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME] [--badput FILE] [<base.yml>]
    key=value ...
    [-- MaxText's absl flags]

The launcher's own options may come anywhere; the rest (in order, and all after `--`) goes to
`maxtext.trainers.pre_train.train`. Without
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
import sys
from typing import Any, NoReturn

from input_client.errors import InputClientError
from input_client.maxtext import MaxTextConfigError, MaxTextHookError, derive, install
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
      ValueError: they ask for another dataset type, name data files that grain_file_type
        cannot read (`derive.check_file_names`), or, with no config file among them (whose
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
    _check_file_names(
        keys,
        yml=yml,
        train=not train_spec,
        evaluate=not eval_spec and ((interval or 0) > 0 or (yml and interval is None)),
    )
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's usage block would bury the one line that says what is wrong.
        self.exit(2, f"{self.prog}: {message} (--help lists the launcher's options).\n")


def _parser() -> _Parser:
    # No abbreviations: `--s` is refused by name rather than taken for --server or --spec.
    parser = _Parser(
        prog="python -m input_client.maxtext.train",
        description="Runs MaxText's pre-training trainer fed by an input server. The "
        "launcher's options may come anywhere among MaxText's key=value arguments; arguments "
        "after `--` go to MaxText as they are (e.g. absl's flags).",
        allow_abbrev=False,
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
        "--badput",
        metavar="FILE",
        help="append the run's data-loading badput (its first batch's wait and each step's, "
        "the worst host's on several processes) to FILE as JSON lines; "
        "input_client.badput.job_badput(FILE) sums the restarts",
    )
    parser.add_argument(
        "maxtext",
        nargs="*",
        help="MaxText's own arguments: [base.yml] key=value ...",
    )
    return parser


def parse_args(argv: list[str], parser: argparse.ArgumentParser | None = None) -> Any:
    """The launcher's options, found anywhere among MaxText's arguments (`args.maxtext`: those,
    in their order, and everything after `--` as it is). An option the launcher does not have
    exits with one line: MaxText's settings are `key=value`, never `--key`."""
    parser = parser or _parser()
    cut = argv.index("--") if "--" in argv else len(argv)
    args, unknown = parser.parse_known_intermixed_args(argv[:cut])
    flags = [a for a in unknown if a.startswith("-")]
    if flags:
        name = flags[0].split("=", 1)[0]
        parser.error(
            f"unknown option {name!r}: MaxText's own settings are key=value without dashes "
            f"(e.g. steps=20), and flags meant for MaxText's absl go after `--`"
        )
    args.maxtext = [*args.maxtext, *unknown, *argv[cut + 1 :]]
    return args


def _check_file_names(keys: dict[str, str], *, yml: bool, train: bool, evaluate: bool) -> None:
    """The derivation's file-name check, before MaxText's set-up (a minute) rather than after
    it, for the data files named on the command line that MaxText will read (`train`,
    `evaluate`). With a config file its grain_file_type is unknown here: then only names no
    file type reads are refused."""
    file_type = keys.get("grain_file_type") or (None if yml else "arrayrecord")
    # A mixture config file is left to the derivation (it is read once MaxText runs).
    named = []
    if train and not keys.get("grain_train_mixture_config_path"):
        named = _patterns("grain_train_files", keys.get("grain_train_files", ""))
    if evaluate:
        named += _patterns("grain_eval_files", keys.get("grain_eval_files", ""))
    for key, pattern in named:
        derive.check_file_names(key, pattern, file_type)


def _patterns(key: str, files: str) -> list[tuple[str, str]]:
    """(key, pattern) of each pattern a `grain_*_files` value names ('a*,0.3;b*,0.7' two)."""
    if ";" not in files:
        return [(key, files)] if files else []
    return [(key, part.rsplit(",", 1)[0]) for part in files.split(";")]


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parse_args(sys.argv[1:] if argv is None else argv, parser)
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
            badput_path=args.badput,
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
