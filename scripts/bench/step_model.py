"""A decoder-only language model's train step in plain JAX, for scripts/bench/bench_step.py.

What a MaxText-style trainer runs each step, small enough to write out: token embedding, pre-norm
blocks of rotary self-attention (causal, within a packed row's segments) and a GELU MLP, an
untied output head, the next-token loss weighted by `targets_segmentation`, Adam. Parameters are
float32, the matmuls bfloat16. The loss runs over chunks of tokens under remat, so a 128k
vocabulary's logits (24 GB in float32 for 16 x 2048 tokens) never exist at once.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

HEAD_DIM = 128  # Llama's and MaxText's default head_dim


@dataclasses.dataclass(frozen=True)
class Size:
    """A model's shape: `d_model` wide, `layers` blocks, heads of 128, an MLP 4 x wide."""

    d_model: int
    layers: int
    vocab: int

    @property
    def heads(self) -> int:
        return max(1, self.d_model // HEAD_DIM)

    @property
    def name(self) -> str:
        return f"{self.d_model}x{self.layers}"


def parse_size(text: str, vocab: int) -> Size:
    """`D x L` ("256x4"): d_model D (a multiple of 128, or under it), L layers."""
    try:
        d, layers = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"a model size is D x L, such as 256x4; got {text!r}.")
    if d < 1 or layers < 1 or (d > HEAD_DIM and d % HEAD_DIM):
        raise SystemExit(f"a model size needs d_model under 128 or a multiple of it; got {text!r}.")
    return Size(d, layers, vocab)


def init_params(size: Size, seed: int = 0) -> dict:
    """Float32 parameters, scaled as a GPT-2-style initializer does."""
    rng = np.random.default_rng(seed)
    d, f = size.d_model, 4 * size.d_model

    def w(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    out = 0.02 / math.sqrt(2 * size.layers)
    blocks = [
        {
            "norm1": np.ones(d, np.float32),
            "qkv": w(d, 3 * d),
            "proj": w(d, d, scale=out),
            "norm2": np.ones(d, np.float32),
            "up": w(d, f),
            "down": w(f, d, scale=out),
        }
        for _ in range(size.layers)
    ]
    return {
        "embed": w(size.vocab, d),
        "blocks": blocks,
        "norm": np.ones(d, np.float32),
        "head": w(d, size.vocab),
    }


def param_count(params) -> int:
    import jax

    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def _rms_norm(x, scale):
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (normed * scale).astype(x.dtype)


def _rope(x, positions):
    """Rotary embedding of `x` [B, T, H, Dh] at each token's position in its document."""
    import jax.numpy as jnp

    half = x.shape[-1] // 2
    freq = 1.0 / (10_000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angle = positions.astype(jnp.float32)[:, :, None, None] * freq
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _attention(q, k, v, segments):
    """Causal self-attention within each document of a packed row ([B, T, H, Dh]); padding,
    segment 0, attends to padding, as MaxText's segment-aware masks do. On a TPU, the Pallas
    flash kernel with segment ids (what MaxText runs there): the XLA form keeps B x H x T x T
    float32 scores, 2 GB a layer at 16 x 2048 and 8 heads."""
    import jax
    import jax.numpy as jnp

    if jax.default_backend() == "tpu":
        from jax.experimental.pallas.ops.tpu import flash_attention as fa

        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
        out = fa.flash_attention(
            q, k, v, segment_ids=fa.SegmentIds(segments, segments), causal=True,
            sm_scale=1.0 / math.sqrt(q.shape[-1]),
        )  # fmt: skip
        return out.transpose(0, 2, 1, 3)
    t = segments.shape[1]
    mask = (segments[:, :, None] == segments[:, None, :]) & jnp.tril(jnp.ones((t, t), bool))
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])


def _block(h, p, segments, positions, heads: int):
    import jax
    import jax.numpy as jnp

    b, t, d = h.shape
    bf = jnp.bfloat16
    x = _rms_norm(h, p["norm1"])
    qkv = (x @ p["qkv"].astype(bf)).reshape(b, t, 3, heads, d // heads)
    q, k, v = (qkv[:, :, i] for i in range(3))
    q, k = _rope(q, positions), _rope(k, positions)
    att = _attention(q, k, v, segments).reshape(b, t, d)
    h = h + att @ p["proj"].astype(bf)
    x = _rms_norm(h, p["norm2"])
    return h + jax.nn.gelu(x @ p["up"].astype(bf)) @ p["down"].astype(bf)


def _hidden(params, batch, size: Size):
    """The last layer's normed activations [B, T, D] (bfloat16)."""
    import jax
    import jax.numpy as jnp

    h = params["embed"].astype(jnp.bfloat16)[batch["inputs"]]
    # Each block recomputed in the backward pass (MaxText's remat): otherwise every layer's
    # attention scores (B x heads x T x T in float32, 2 GB at 16 x 2048) are kept at once.
    block = jax.checkpoint(_block, static_argnums=4)
    for p in params["blocks"]:
        h = block(h, p, batch["inputs_segmentation"], batch["inputs_position"], size.heads)
    return _rms_norm(h, params["norm"])


def _loss(params, batch, size: Size, chunk: int):
    import jax
    import jax.numpy as jnp

    h = _hidden(params, batch, size)
    d = h.shape[-1]
    n = h.shape[0] * h.shape[1]
    chunk = math.gcd(n, chunk)
    hs = h.reshape(n // chunk, chunk, d)
    targets = jnp.maximum(batch["targets"].reshape(n // chunk, chunk), 0)  # pad -1: weight 0
    weights = (batch["targets_segmentation"] != 0).reshape(n // chunk, chunk)
    head = params["head"].astype(jnp.bfloat16)

    @jax.checkpoint  # the chunk's logits are recomputed in the backward pass, never all kept
    def chunk_loss(total, xs):
        hc, tc, wc = xs
        logits = (hc @ head).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, tc[:, None], axis=-1)[:, 0]
        nll = jax.nn.logsumexp(logits, axis=-1) - picked
        return total + jnp.sum(nll * wc), None

    total, _ = jax.lax.scan(chunk_loss, jnp.float32(0), (hs, targets, weights))
    return total / jnp.maximum(jnp.sum(weights), 1)


def make_train_step(size: Size, *, lr: float = 3e-4, chunk_tokens: int = 2048):
    """A jitted `step(state, batch) -> (state, loss)`; `state` = (params, Adam's m and v, t),
    donated, as a trainer's is."""
    import functools

    import jax
    import jax.numpy as jnp

    grad = jax.value_and_grad(functools.partial(_loss, size=size, chunk=chunk_tokens))
    b1, b2, eps = 0.9, 0.95, 1e-8

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, batch):
        params, m, v, t = state
        loss, g = grad(params, batch)
        t = t + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
        return (params, m, v, t), loss

    return step


def init_state(size: Size, seed: int = 0):
    """(params, m, v, t) on the default device."""
    import jax
    import jax.numpy as jnp

    params = jax.device_put(init_params(size, seed))
    zeros = jax.tree.map(jnp.zeros_like, params)
    return params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.int32(0)
