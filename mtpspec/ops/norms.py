"""Norms of the Qwen3-Next / Qwen3.5 GDN layers, in float32, returned in the input's dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_norm(x: jax.Array, *, eps: float = 1e-6, axis: int = -1) -> jax.Array:
    """x / sqrt(Σ x² + eps) along ``axis`` (fla / HF ``l2norm``), for q and k."""
    xf = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.sum(xf * xf, axis=axis, keepdims=True) + eps)
    return (xf * inv).astype(x.dtype)


def rms_norm(
    x: jax.Array, weight: jax.Array, *, eps: float = 1e-6, unit_offset: bool = True
) -> jax.Array:
    """RMS norm over the last axis. ``unit_offset``: scale by (1 + w) (zero-init, Qwen3-Next/3.5
    decoder norms); otherwise by w."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    w = weight.astype(jnp.float32)
    return (y * (1.0 + w if unit_offset else w)).astype(x.dtype)


def gated_rms_norm(
    x: jax.Array, gate: jax.Array, weight: jax.Array, *, eps: float = 1e-6
) -> jax.Array:
    """GDN output norm: rms_norm(x) · w · silu(gate), plain weight (not 1 + w)."""
    if x.shape != gate.shape:
        raise ValueError(f"x {x.shape} and gate {gate.shape} must have the same shape")
    y = rms_norm(x, weight, eps=eps, unit_offset=False).astype(jnp.float32)
    return (y * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)
