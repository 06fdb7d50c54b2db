"""Batch codec: named numpy arrays <-> `Tensor` messages of raw little-endian bytes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from input_client._proto.input_server.v1 import input_service_pb2 as pb


def encode_tensors(arrays: Mapping[str, np.ndarray]) -> list[pb.Tensor]:
    """One `Tensor` per array, in little-endian byte order."""
    out = []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        out.append(pb.Tensor(name=name, dtype=a.dtype.name, shape=a.shape, data=a.tobytes()))
    return out


def decode_tensors(tensors: Any) -> dict[str, np.ndarray]:
    """Arrays that view the message's bytes (`np.frombuffer`, no copy; read-only)."""
    out = {}
    for t in tensors:
        dtype = np.dtype(t.dtype).newbyteorder("<")
        out[t.name] = np.frombuffer(t.data, dtype=dtype).reshape(tuple(t.shape))
    return out


def encode_state(state: Mapping[str, Any]) -> bytes:
    return json.dumps(state, sort_keys=True, separators=(",", ":")).encode()


def decode_state(blob: bytes) -> dict[str, Any]:
    return json.loads(blob.decode()) if blob else {}
