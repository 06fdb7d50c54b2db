"""Resharded states at the bounds, from real streams: a 16-component mixture of 4,096
three-token documents each (shard i of 4,096 holds one of each), the state of one of its
streams once it took batches, and the state of the one new host that `reshard` makes of a run
of many old ones."""

from __future__ import annotations

import json

from input_client import PipelineSpec, reshard

COMPONENTS, OLD = 16, 4096  # the largest state: 4,096 old streams of 16 components


def write_mixture(folder: str) -> str:
    """The mixture's files in `folder` (`c{c}.jsonl`, record r of component c holding the ids
    [c + 3, 2 + r % 7, 1 + r % 5]); the first file's path."""
    for c in range(COMPONENTS):
        with open(f"{folder}/c{c}.jsonl", "w") as f:
            f.writelines(
                json.dumps({"ids": [c + 3, 2 + r % 7, 1 + r % 5]}) + "\n" for r in range(OLD)
            )
    return f"{folder}/c0.jsonl"


def mixture_spec(folder: str, shard: tuple[int, int], *, size: int) -> PipelineSpec:
    """Shard `shard` (index, count) of the mixture in `folder`, endless, `size` rows of 64."""
    return PipelineSpec(
        source=[
            {"paths": [f"{folder}/c{c}.jsonl"], "token_field": "ids", "name": f"c{c}", "weight": 1}
            for c in range(COMPONENTS)
        ],
        tokenizer={"vocab_size": 1000, "add_bos": False, "add_eos": False},
        batch={"seq_len": 64, "size": size},
        order={"seed": 7, "epochs": 0},
        shard={"index": shard[0], "count": shard[1]},
        workers={"count": 0},
    )


def stream_state(client, spec: PipelineSpec, *, batches: int = 1, until_doc: int = 0) -> dict:
    """The state of a stream of `spec` from `client` (an `InputClient`), as JSON carries it,
    once it took at least `batches` batches and reached document `until_doc`."""
    taken, state = 0, None
    with client.batches(spec) as it:
        while taken < batches or state["doc"] < until_doc:
            next(it)
            taken += 1
            state = json.loads(json.dumps(it.get_state()))
    return state


def new_host_state(states: list, hosts: int) -> dict:
    """The state `reshard` gives the one new host of a run of `hosts` old ones, the first of
    which read `states` (the others nothing)."""
    return reshard(states + [None] * (hosts - len(states)), 1)[0]
