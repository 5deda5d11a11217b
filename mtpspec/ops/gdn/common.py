"""Shared pieces of every GDN form: the aux (commit) data type, layout helpers, closed-form state.

Shape letters: b batch, t time (window positions), h value heads, k key dim, v value dim.
All math is float32 with ``Precision.HIGHEST`` (TF32 on GPU would break the 1e-5 agreement).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtpspec.ops.conv import check_counts

HIGHEST = jax.lax.Precision.HIGHEST


def einsum(spec: str, *operands: jax.Array) -> jax.Array:
    """``jnp.einsum`` at full float32 precision."""
    return jnp.einsum(spec, *operands, precision=HIGHEST)


class GDNAux(NamedTuple):
    """What a GDN pass hands to speculative commit, per window position.

    u:      [b, t, h, v] float32 — the delta-rule update u_t = β_t (v_t − (e^{g_t} S_{t−1})ᵀ k_t);
            exactly the rows the recurrence adds to the state (S_t = e^{g_t} S_{t−1} + k_t u_tᵀ).
    g_cum:  [b, t, h] float32 — G_t = Σ_{i≤t} g_i, cumulative log-decay from the window start.
    states: [b, t, h, k, v] float32 or None — S_t after each position (only when requested).
    """

    u: jax.Array
    g_cum: jax.Array
    states: jax.Array | None = None


def expand_key_heads(x: jax.Array, num_value_heads: int) -> jax.Array:
    """[b, t, hk, k] -> [b, t, hv, k]: value head i reads key head i // r (HF repeat_interleave)."""
    r = num_value_heads // x.shape[2]
    return x if r == 1 else jnp.repeat(x, r, axis=2)


def state_after(
    initial_state: jax.Array,  # [b, h, k, v] float32, state before the window
    k: jax.Array,  # [b, t, h, k] keys of the window (already expanded to value heads)
    aux: GDNAux,  # from the window's pass
    n: jax.Array,  # [b] int32 in 0..t: how many window positions to keep
) -> jax.Array:  # [b, h, k, v] float32
    """Closed-form state after the first ``n`` positions of a window (the "replay" commit).

    S_n = e^{G_n} S_0 + Σ_{i≤n} e^{G_n − G_i} k_i u_iᵀ, with G_0 = 0. One masked matmul per head,
    no serial step. Exponent differences are masked with ``where`` *before* ``exp``.
    """
    b, t = k.shape[:2]
    check_counts(n, b, t)
    n = jnp.asarray(n, jnp.int32).reshape(b)
    g_cum = aux.g_cum.astype(jnp.float32)  # [b, t, h]
    last = jnp.clip(n - 1, 0, t - 1)
    g_n = jnp.take_along_axis(g_cum, last[:, None, None], axis=1)[:, 0]  # [b, h]
    g_n = jnp.where((n > 0)[:, None], g_n, 0.0)
    keep = jnp.arange(t)[None, :] < n[:, None]  # [b, t]
    diff = jnp.where(keep[:, :, None], g_n[:, None, :] - g_cum, -jnp.inf)  # [b, t, h]
    weight = jnp.exp(diff)  # zero where masked
    kw = k.astype(jnp.float32) * weight[..., None]  # [b, t, h, k]
    added = einsum("bthk,bthv->bhkv", kw, aux.u.astype(jnp.float32))
    return jnp.exp(g_n)[..., None, None] * initial_state.astype(jnp.float32) + added
