"""The tiny decoder that the MaxText tests and `scripts/bench/bench_maxtext.py` train."""

from __future__ import annotations

# The tiny decoder of the MaxText tests and benchmark (MaxText's own flags), on one CPU device.
TINY_MAXTEXT = [
    "vocab_size=8192",
    "base_emb_dim=64",
    "base_num_decoder_layers=2",
    "base_num_query_heads=4",
    "base_num_kv_heads=4",
    "head_dim=16",
    "base_mlp_dim=256",
    "hardware=cpu",
    "attention=dot_product",
    "log_config=false",
    "enable_tensorboard=false",
]
