"""The input server as MaxText's input pipeline: a drop-in for its Grain factories.

```
from input_client import maxtext as input_maxtext
input_maxtext.install("unix:///run/input.sock")  # the specs derived from MaxText's config
# then MaxText's own trainer, e.g. maxtext.trainers.pre_train.train.main(argv)
```

or the launcher, `python -m input_client.maxtext.train --server ADDRESS [--spec SPEC.toml]
[--eval-spec SPEC.toml] <base.yml> key=value ...`.

`make_train_iterator` / `make_eval_iterator` have the signature of MaxText's
`make_grain_train_iterator(config, global_mesh, process_indices)`. Each takes its spec as given
to `install` (a `PipelineSpec` or a TOML path) or, without one, derives it from the `config`
MaxText passes (`derive`: `grain_train_files`, `max_target_length`, `tokenizer_path`, ...,
refusing by name what the server cannot honour); checks it against the config
(`check.check_shape`, `check.check_tokenizer`), reads this host's shard, and returns MaxText's
own `MultiHostDataLoadIterator` over the server's stream, with batches in MaxText's conventions
(`conventions.to_maxtext`). With `dataset_type=grain`, MaxText's checkpoints then save and
restore the data position (`source.ServerIterator.get_state`), on another number of processes
too (`_resume`: the step's states resharded). Eval is a finite, unshuffled pass from the start
at every eval.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import grpc

from input_client.auth import read_token_file
from input_client.client import InputClient
from input_client.errors import StreamError
from input_client.fanin import ORDERS
from input_client.maxtext import derive
from input_client.maxtext._data_wait import report_train_wait
from input_client.maxtext._hook import MaxTextHookError, interface_module, multihost_dataloading
from input_client.maxtext._resume import hook_restore
from input_client.maxtext.check import (
    MaxTextConfigError,
    check_shape,
    check_tokenizer,
    check_vocab_size,
    maxtext_pad_id,
    shard_for,
)
from input_client.maxtext.conventions import to_maxtext
from input_client.maxtext.source import ServerSource
from input_client.spec import OrderSpec, PipelineSpec
from input_client.tls import TlsSettings, open_channel, refuse_token_in_the_clear

__all__ = [
    "MaxTextConfigError",
    "MaxTextHookError",
    "configure",
    "install",
    "make_eval_iterator",
    "make_train_iterator",
    "to_maxtext",
]


@dataclasses.dataclass(frozen=True)
class _Settings:
    server: str | tuple[str, ...]  # several: a fan-in
    spec: PipelineSpec | None  # None: derived from MaxText's config
    eval_spec: PipelineSpec | None
    token: str | None
    prefetch: int
    connect_timeout_s: float
    tls: TlsSettings = TlsSettings()
    order: str = "round_robin"
    badput_path: str | None = None  # the run's data-loading badput, appended (process 0)


_settings: _Settings | None = None
RECONNECT_DEADLINE_S = 300.0  # the client's default: a rescheduled server, not a lost host


def _spec(spec: PipelineSpec | str) -> PipelineSpec:
    return spec if isinstance(spec, PipelineSpec) else PipelineSpec.from_toml(spec)


def configure(
    server: str | Sequence[str],
    spec: PipelineSpec | str | None = None,
    eval_spec: PipelineSpec | str | None = None,
    *,
    token_file: str | None = None,
    prefetch: int = 2,
    connect_timeout_s: float = 30.0,
    tls: bool = False,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_server_name: str | None = None,
    order: str = "round_robin",
    badput_path: str | None = None,
) -> None:
    """Says which server and specs the factories use (specs as `PipelineSpec`s or TOML paths;
    a spec left out is derived from MaxText's config when its factory is called).

    `connect_timeout_s`: how long a factory waits for the server before raising
    `ConnectionError`. `tls`, `tls_ca`, `tls_cert`, `tls_key`, `tls_server_name`: as
    `InputClient`'s, for a server started with `--tls-cert` (TLS options on a `unix:` server
    are refused here, at once). Several servers (a list, or one string of comma-separated
    addresses) fan in (`input_client.fanin`), interleaved in `order`; the checkpoint then
    holds every server's position. `badput_path`: a file the run's data-loading badput is
    appended to as a JSON line (`input_client.badput`; by process 0, the worst host's waits on
    several processes)."""
    global _settings
    if isinstance(server, str):
        server = split_servers(server)
    servers = tuple(server)
    if not servers or not all(servers):
        raise ValueError(f"the server address {','.join(servers)!r} names no server.")
    if len(set(servers)) != len(servers):
        raise ValueError(f"the server addresses {','.join(servers)!r} name a server twice.")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}; got {order!r}.")
    token = None if token_file is None else read_token_file(token_file)  # its mistakes now
    tls_settings = TlsSettings.of(
        tls=tls,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_server_name=tls_server_name,
    )
    if tls_settings.enabled:  # its files' and the address's mistakes now, not at MaxText's step 0
        for address in servers:
            open_channel(address, tls_settings, ()).close()
    elif token is not None:
        for address in servers:
            refuse_token_in_the_clear(address)
    _settings = _Settings(
        servers[0] if len(servers) == 1 else servers,
        None if spec is None else _spec(spec),
        None if eval_spec is None else _spec(eval_spec),
        token,
        prefetch,
        connect_timeout_s,
        tls_settings,
        order,
        None if badput_path is None else str(badput_path),
    )


def split_servers(value: str) -> list[str]:
    """The servers one `--server` string names: comma-separated addresses (a fan-in). gRPC's
    own address lists (`ipv4:A:P,B:P`) stay one target; a comma inside a socket path stays
    in it, as a comma splits only before the next `unix:` address."""
    if value.startswith(("ipv4:", "ipv6:")):
        return [value]
    if value.startswith(("unix:", "unix-abstract:")):
        return [a.strip() for a in re.split(r",(?=\s*unix(?:-abstract)?:)", value)]
    return [a.strip() for a in value.split(",")]


def install(
    server: str,
    spec: PipelineSpec | str | None = None,
    eval_spec: PipelineSpec | str | None = None,
    **options: Any,
) -> None:
    """`configure`, then sets MaxText's Grain factories to this module's. Run MaxText with
    `dataset_type=grain` (its iterator checkpointing needs it). Without `spec`, the train spec
    is derived from MaxText's `grain_train_files` (or `grain_train_mixture_config_path`) and
    the rest of its config; without `eval_spec`, the eval spec from `grain_eval_files`. With a
    spec, MaxText's config check still asks for its files: any non-empty value does, as
    nothing reads it. A checkpoint written by another number of processes restores with the
    data position resharded (`input_client.reshard`)."""
    configure(server, spec, eval_spec, **options)
    interface = interface_module()
    hook_restore()  # a checkpoint of another process count: its data states resharded
    interface.make_grain_train_iterator = make_train_iterator
    interface.make_grain_eval_iterator = make_eval_iterator


def make_train_iterator(config: Any, global_mesh: Any, process_indices: list[int]) -> Any:
    """MaxText's train iterator, fed by the server."""
    return _make(config, global_mesh, process_indices, train=True)


def make_eval_iterator(config: Any, global_mesh: Any, process_indices: list[int]) -> Any:
    """MaxText's eval iterator: the eval spec once, unshuffled, from its start at each eval."""
    return _make(config, global_mesh, process_indices, train=False)


def _make(config: Any, global_mesh: Any, process_indices: list[int], *, train: bool) -> Any:
    import jax

    if _settings is None:
        raise MaxTextConfigError(
            "input_client.maxtext has no server: call input_client.maxtext.install(...) (or "
            "configure) first, or use python -m input_client.maxtext.train."
        )
    which = "train" if train else "eval"
    spec = _settings.spec if train else _settings.eval_spec
    if spec is None:  # from the config MaxText runs with, base.yml's defaults included
        derived = derive.train_spec if train else derive.eval_spec
        spec = derived(config, process_count=jax.process_count())
        # What the run streams, said once in its log as JSON (a spec file's tables), so that
        # it can be read back, kept, or given as --spec.
        print(
            f"input_client.maxtext: the {which} spec derived from MaxText's config: "
            f"{json.dumps(spec.to_dict())}",
            file=sys.stderr,
            flush=True,
        )
    if not train:  # one repeatable pass: the same batches at every eval
        spec = dataclasses.replace(
            spec, order=OrderSpec(seed=spec.order.seed, shuffle=False, epochs=1)
        )
    spec = shard_for(spec, list(process_indices), jax.process_index())
    check_shape(spec, config, process_count=jax.process_count(), which=which)
    client = InputClient(
        _settings.server,
        token=_settings.token,
        connect_timeout_s=_settings.connect_timeout_s,
        **_settings.tls.keywords(),
    )
    client.wait_ready()  # a missing server or another wire protocol, said before anything else
    if spec.tokenizer.model:
        tokenizer = _describe(client, spec)
        check_tokenizer(spec, config, tokenizer, which=which)
        pad_id = maxtext_pad_id(tokenizer, spec.tokenizer.kind)
    else:  # pre-tokenized, no model: the spec says the vocabulary and the pad id
        check_vocab_size(spec, config, which=which)
        pad_id = -1 if spec.tokenizer.pad_id is None else spec.tokenizer.pad_id
    # Later opens (each eval, a restored state) wait for a restarting server as long as a
    # broken stream does.
    client.connect_timeout_s = max(client.connect_timeout_s, RECONNECT_DEADLINE_S)

    def open_stream(state):
        return client.batches(
            spec,
            state=state,
            prefetch=_settings.prefetch,
            reconnect_deadline_s=RECONNECT_DEADLINE_S,
            order=_settings.order,
        )

    source = ServerSource(open_stream, pad_id=pad_id, packing=spec.batch.packing)
    weakref.finalize(source, client.close)
    if train:  # each step's wait for its batch, in MaxText's own step metrics
        report_train_wait(source, _settings.badput_path)
    padding = config.generate_padding_batch_train if train else config.generate_padding_batch_eval
    return multihost_dataloading().MultiHostDataLoadIterator(source, global_mesh, bool(padding))


def _describe(client: InputClient, spec: PipelineSpec) -> Any:
    try:
        return client.describe_tokenizer(spec)
    except StreamError as e:
        if e.code == grpc.StatusCode.UNIMPLEMENTED:
            raise MaxTextConfigError(
                f"the server at {client.address!r} cannot describe a tokenizer "
                f"(DescribeTokenizer): it is older than this client; update input-server."
            ) from None
        raise
