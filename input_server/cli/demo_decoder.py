"""The demo's model: a one-layer decoder in plain JAX with its loss and an Adam step, small
enough to train in seconds on two CPU cores (`cli/demo.py` feeds it the server's batches)."""

from __future__ import annotations

import math
from typing import Any

# The model: small enough to train 50 steps in seconds on two CPU cores, big enough to learn
# the corpus's unigram and bigram statistics in that time (loss falls from ln(1000) ~ 6.9).
VOCAB_SIZE = (
    1000  # the demo tokenizer's vocabulary (data/builtin_corpora.py's `ensure_demo_assets`)
)
D_MODEL = 64
NUM_HEADS = 4
D_FF = 256
LEARNING_RATE = 1e-2
LOSS_WINDOW = 5  # steps averaged at each end to decide whether the loss went down
# The smallest run: two steps, since the loss of the first and the last are compared.
LEAST = {"steps": 2, "seq_len": 1, "batch_size": 1}


def init_params(
    key: Any,
    *,
    seq_len: int,
    vocab_size: int = VOCAB_SIZE,
    d_model: int = D_MODEL,
    d_ff: int = D_FF,
) -> dict[str, Any]:
    """Random parameters of the one-layer decoder (scaled so activations start near unit size)."""
    import jax
    import jax.numpy as jnp

    k = iter(jax.random.split(key, 12))

    def dense(fan_in: int, fan_out: int) -> Any:
        return jax.random.normal(next(k), (fan_in, fan_out), jnp.float32) / math.sqrt(fan_in)

    return {
        "embed": jax.random.normal(next(k), (vocab_size, d_model), jnp.float32) * 0.02,
        "pos_embed": jax.random.normal(next(k), (seq_len, d_model), jnp.float32) * 0.02,
        "attn": {
            "norm": jnp.ones(d_model),
            "wq": dense(d_model, d_model),
            "wk": dense(d_model, d_model),
            "wv": dense(d_model, d_model),
            "wo": dense(d_model, d_model),
        },
        "mlp": {
            "norm": jnp.ones(d_model),
            "w1": dense(d_model, d_ff),
            "b1": jnp.zeros(d_ff),
            "w2": dense(d_ff, d_model),
            "b2": jnp.zeros(d_model),
        },
        "final_norm": jnp.ones(d_model),
        "unembed": dense(d_model, vocab_size),
    }


def count_params(params: Any) -> int:
    import jax

    return sum(int(x.size) for x in jax.tree.leaves(params))


def _rms_norm(x: Any, scale: Any) -> Any:
    import jax

    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale


def forward(params: dict[str, Any], tokens: Any, segment_ids: Any, positions: Any) -> Any:
    """Logits [batch, seq, vocab] of a packed batch.

    A token attends only to earlier tokens of its own document: packing puts several documents
    in one row, and attending across them would let the model read a neighbour's text
    (MaxText masks by segment ids the same way). Positions restart at each document.
    """
    import jax
    import jax.numpy as jnp

    batch, seq = tokens.shape
    head_dim = D_MODEL // NUM_HEADS
    x = params["embed"][tokens] + params["pos_embed"][positions]

    a = params["attn"]
    h = _rms_norm(x, a["norm"])
    q, k, v = ((h @ a[w]).reshape(batch, seq, NUM_HEADS, head_dim) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
    mask = (causal[None] & same_segment)[:, None]
    # Finite, not -inf: padding rows (segment 0) still see themselves, so no row is all masked.
    scores = jnp.where(mask, scores, -1e9)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    x = x + attn.reshape(batch, seq, D_MODEL) @ a["wo"]

    m = params["mlp"]
    h = _rms_norm(x, m["norm"])
    x = x + jax.nn.gelu(h @ m["w1"] + m["b1"]) @ m["w2"] + m["b2"]
    return _rms_norm(x, params["final_norm"]) @ params["unembed"]


def loss_fn(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    """Mean cross-entropy over real target tokens (padding, segment 0, counts for nothing)."""
    import jax
    import jax.numpy as jnp

    logits = forward(
        params, batch["inputs"], batch["inputs_segmentation"], batch["inputs_position"]
    )
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
    weights = (batch["targets_segmentation"] != 0).astype(jnp.float32)
    return (nll * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def adam_init(params: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"count": jnp.zeros((), jnp.int32), "mu": zeros, "nu": zeros}


def adam_update(
    params: Any,
    grads: Any,
    opt: dict[str, Any],
    *,
    lr: float = LEARNING_RATE,
    b1: float = 0.9,
    b2: float = 0.99,
    eps: float = 1e-8,
) -> tuple[Any, dict]:
    """One Adam step (optax.adam's arithmetic), written out so the demo needs no optax."""
    import jax
    import jax.numpy as jnp

    count = opt["count"] + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["mu"], grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["nu"], grads)
    t = count.astype(jnp.float32)
    mu_scale, nu_scale = 1 / (1 - b1**t), 1 / (1 - b2**t)
    params = jax.tree.map(
        lambda p, m, v: p - lr * (m * mu_scale) / (jnp.sqrt(v * nu_scale) + eps), params, mu, nu
    )
    return params, {"count": count, "mu": mu, "nu": nu}


def train_step(state: dict[str, Any], batch: dict[str, Any]) -> tuple[dict, dict]:
    """Loss, gradients and an Adam update; returns the new state and the step's metrics."""
    import jax

    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
    params, opt = adam_update(state["params"], grads, state["opt"])
    return {"params": params, "opt": opt}, {"loss": loss}


MODEL_KEYS = ("inputs", "inputs_segmentation", "inputs_position", "targets", "targets_segmentation")
