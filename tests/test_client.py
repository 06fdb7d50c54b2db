"""The thin client: import isolation, jax placement with a Sharding, sequence checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import input_client
from input_client import InputClient
from input_server.pack import FIELDS


def test_public_names_import():
    for name in input_client.__all__:
        assert getattr(input_client, name) is not None


def test_client_streams_without_grain_sentencepiece_or_jax(server, make_spec):
    spec = make_spec()
    code = textwrap.dedent(f"""
        import json, sys
        from input_client import InputClient, PipelineSpec
        spec = PipelineSpec.from_dict(json.loads({json.dumps(json.dumps(spec.to_dict()))}))
        with InputClient({server.targets[0]!r}) as c, c.batches(spec) as it:
            n = sum(1 for _ in it)
        heavy = [m for m in ("grain", "sentencepiece", "jax") if m in sys.modules]
        print(json.dumps({{"batches": n, "heavy": heavy}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["batches"] > 10
    assert result["heavy"] == []


def test_sharding_places_global_jax_arrays(server, make_spec):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    assert len(devices) == 8, "conftest sets XLA_FLAGS for 8 CPU devices"
    mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    spec = make_spec(batch={"size": 8})
    with InputClient(server.targets[0]) as c:
        with c.batches(spec, sharding=sharding) as it:
            placed = next(it)
        with c.batches(spec) as it:
            plain = next(it)
    for k in FIELDS:
        assert isinstance(placed[k], jax.Array)
        assert placed[k].sharding == sharding
        assert placed[k].shape == (8, 128)
        np.testing.assert_array_equal(np.asarray(placed[k]), plain[k])
        # Each of the 4 data shards holds 2 rows, replicated over the model axis.
        assert {s.data.shape for s in placed[k].addressable_shards} == {(2, 128)}


def test_sequence_gap_raises(server, make_spec):
    """A resumed stream whose state claims another position is caught by the sequence check."""
    from input_client import SequenceError

    with InputClient(server.targets[0]) as c:
        with c.batches(make_spec()) as it:
            next(it)
            state = it.get_state()
        # A client that expects batch 7 next while the server resumes at 1: the check must fire.
        it = c.batches(make_spec(), state=state)
        it._expected_seq = 7
        with pytest.raises(SequenceError, match="expected batch 7, got batch 1"):
            next(it)
